# Installation (`cmake --install BUILD --prefix P`) and the Debian packages
# (`scripts/package.sh` runs CPack). Under P:
#   bin/                     dtrun, dtstore, dtrun-srun
#   lib*/                    libdtrun_store.so.X.Y (dtrun::store), libdtrun_train.so.X.Y (dtrun::train)
#   include/dtrun/           the public headers, as rendezvous/*.h and lib/*.h
#   lib*/cmake/dtrun/        dtrunConfig.cmake, dtrunConfigVersion.cmake, dtrunTargets.cmake
#   lib*/pkgconfig/          dtrun-store.pc, dtrun.pc
#   lib/python3*/dist-packages/dtrun/   the interactive session package (%load_ext dtrun)
#   share/man/man1, share/bash-completion, share/zsh/vendor-completions
# Components: `runtime` (package dtrun) and `dev` (package dtrun-dev).
include(CMakePackageConfigHelpers)

set(DTRUN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/dtrun)
# Where Debian's python3 finds packages: /usr/lib/python3/dist-packages under
# /usr (the .deb), lib/python3.X/dist-packages under any other prefix
# (/usr/local's is on Debian's sys.path).
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(dtrun_python_default lib/python3/dist-packages)
else()
  find_program(DTRUN_SYSTEM_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)
  set(py 3)
  if(DTRUN_SYSTEM_PYTHON)
    execute_process(COMMAND ${DTRUN_SYSTEM_PYTHON} -c "import sys; print('%d.%d' % sys.version_info[:2])"
                    OUTPUT_VARIABLE py OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  set(dtrun_python_default lib/python${py}/dist-packages)
endif()
set(DTRUN_INSTALL_PYTHONDIR ${dtrun_python_default} CACHE STRING
    "Where the interactive session's Python package is installed, relative to the prefix")

# Programs and the Python package.
install(TARGETS dtrun dtstore RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/dtrun-srun
        DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/apps/dtrun/python/dtrun
        DESTINATION ${DTRUN_INSTALL_PYTHONDIR} COMPONENT runtime
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# Libraries: the versioned files in runtime, the unversioned link in dev.
set(dtrun_libraries dtrun_store)
if(TARGET dtrun_train)
  list(APPEND dtrun_libraries dtrun_train)
  # libdtrun_train finds libdtrun_store beside it under any prefix.
  set_target_properties(dtrun_train PROPERTIES INSTALL_RPATH "$ORIGIN")
endif()
install(TARGETS ${dtrun_libraries} EXPORT dtrunTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)

# Public headers: what a user of the store client, Distributed, DDP, FSDP,
# checkpoints and the trainer includes, and what those include.
install(FILES
  ${PROJECT_SOURCE_DIR}/rendezvous/memory_store.h
  ${PROJECT_SOURCE_DIR}/rendezvous/prefix_store.h
  ${PROJECT_SOURCE_DIR}/rendezvous/store.h
  ${PROJECT_SOURCE_DIR}/rendezvous/store_client.h
  ${PROJECT_SOURCE_DIR}/rendezvous/wire.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrun/rendezvous COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/rendezvous/util/status.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrun/rendezvous/util COMPONENT dev)
if(TARGET dtrun_train)
  set(dtrun_lib_headers checkpoint.h ddp.h dist_env.h fsdp.h model.h
    precision.h process_group.h standby_worker.h
    train_config.h trainer.h)
  if(EXISTS ${PROJECT_SOURCE_DIR}/lib/torch_compat.h)
    list(APPEND dtrun_lib_headers torch_compat.h)
  endif()
  list(TRANSFORM dtrun_lib_headers PREPEND ${PROJECT_SOURCE_DIR}/lib/)
  install(FILES ${dtrun_lib_headers}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrun/lib COMPONENT dev)
endif()

include(${CMAKE_CURRENT_LIST_DIR}/install_dev.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/install_docs.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/package.cmake)
