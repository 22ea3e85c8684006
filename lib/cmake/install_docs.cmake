# Man pages made from --help and --version by Debian's help2man, and the
# shell completions printed by `dtrun --print-completion`; built with the
# programs, installed with them. Included by install.cmake.
set(dtrun_docs_dir ${CMAKE_BINARY_DIR}/docs)
file(MAKE_DIRECTORY ${dtrun_docs_dir})
set(dtrun_docs
  ${dtrun_docs_dir}/dtrun.bash-completion ${dtrun_docs_dir}/_dtrun)
add_custom_command(
  OUTPUT ${dtrun_docs}
  COMMAND sh -c "\"$1\" --print-completion bash > \"$2\" && \"$1\" --print-completion zsh > \"$3\""
          sh $<TARGET_FILE:dtrun> ${dtrun_docs}
  DEPENDS dtrun
  COMMENT "Writing dtrun's shell completions" VERBATIM)
install(FILES ${dtrun_docs_dir}/dtrun.bash-completion RENAME dtrun
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions COMPONENT runtime)
install(FILES ${dtrun_docs_dir}/_dtrun
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions COMPONENT runtime)

find_program(DTRUN_HELP2MAN help2man)
if(DTRUN_HELP2MAN)
  foreach(prog dtrun dtstore)
    if(prog STREQUAL "dtrun")
      set(what "launch distributed PyTorch workers: a C++ replacement for torchrun")
    else()
      set(what "standalone c10d-compatible TCP store server")
    endif()
    set(page ${dtrun_docs_dir}/${prog}.1.gz)
    add_custom_command(
      OUTPUT ${page}
      COMMAND sh -c "\"$1\" --no-info --name=\"$2\" --output=\"$4.tmp\" \"$3\" && gzip -9n < \"$4.tmp\" > \"$4\" && rm \"$4.tmp\""
              sh ${DTRUN_HELP2MAN} ${what} $<TARGET_FILE:${prog}> ${page}
      DEPENDS ${prog}
      COMMENT "Writing ${prog}(1) with help2man" VERBATIM)
    list(APPEND dtrun_docs ${page})
    install(FILES ${page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
  endforeach()
else()
  message(STATUS "dtrun: help2man not found: no man pages (apt-get install help2man)")
endif()
add_custom_target(dtrun_docs ALL DEPENDS ${dtrun_docs})
