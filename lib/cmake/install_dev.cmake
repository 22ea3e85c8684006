# dtrunConfig.cmake (find_package(dtrun): targets dtrun::store and, with
# libtorch, dtrun::train, which carries its torch dependency) and the
# pkg-config files. Included by install.cmake.
set(DTRUN_CONFIG_WITH_TORCH OFF)
if(TARGET dtrun_train)
  set(DTRUN_CONFIG_WITH_TORCH ON)
endif()
install(EXPORT dtrunTargets NAMESPACE dtrun:: DESTINATION ${DTRUN_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dtrunConfig.cmake.in
  ${CMAKE_BINARY_DIR}/dtrunConfig.cmake INSTALL_DESTINATION ${DTRUN_INSTALL_CMAKEDIR})
# 0.x releases make no promise between minor versions.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/dtrunConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/dtrunConfig.cmake ${CMAKE_BINARY_DIR}/dtrunConfigVersion.cmake
        DESTINATION ${DTRUN_INSTALL_CMAKEDIR} COMPONENT dev)

# pkg-config: paths relative to the .pc file, so any --prefix works.
file(RELATIVE_PATH dtrun_pc_to_prefix
     /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" dtrun_pc_to_prefix "${dtrun_pc_to_prefix}")
set(DTRUN_PC_PREFIX "\${pcfiledir}/${dtrun_pc_to_prefix}")
set(dtrun_pc_files dtrun-store.pc)
if(TARGET dtrun_train)
  # Torch ships no .pc file: name its include folders, its defines (gloo,
  # the C++ ABI) and its libraries here.
  set(DTRUN_PC_TORCH_CFLAGS "${TORCH_CXX_FLAGS}")
  set(torch_defs "")
  if(TARGET torch_cpu)
    get_target_property(torch_defs torch_cpu INTERFACE_COMPILE_DEFINITIONS)
  endif()
  foreach(def ${torch_defs})
    string(APPEND DTRUN_PC_TORCH_CFLAGS " -D${def}")
  endforeach()
  foreach(dir ${TORCH_INCLUDE_DIRS})
    if(NOT dir STREQUAL "/usr/include")
      string(APPEND DTRUN_PC_TORCH_CFLAGS " -I${dir}")
    endif()
  endforeach()
  get_filename_component(torch_libdir "${TORCH_LIBRARY}" DIRECTORY)
  set(DTRUN_PC_TORCH_LIBS "-L${torch_libdir} -ltorch -ltorch_cpu -lc10")
  list(APPEND dtrun_pc_files dtrun.pc)
endif()
foreach(pc ${dtrun_pc_files})
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.in ${CMAKE_BINARY_DIR}/pkgconfig/${pc} @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/${pc}
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()
