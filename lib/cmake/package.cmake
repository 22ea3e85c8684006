# Debian packages by CPack (scripts/package.sh): `dtrun` (programs, shared
# libraries, the Python session package, man pages, completions) and
# `dtrun-dev` (headers, CMake and pkg-config files). dpkg-shlibdeps derives
# the shared-library Depends; the rest is named here. Included by install.cmake.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dtrun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "dtrun maintainers <dtrun-maintainers@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "C++ replacement for torchrun, with a DDP/FSDP training library")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)  # as dh_strip would; debug info stays in the build tree
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME dtrun)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
  "C++ replacement for torchrun, with a DDP/FSDP training library
 dtrun launches one worker per slot with torchrun's environment, hosts a
 c10d-compatible TCP store, runs elastic rendezvous across nodes and restarts
 failed groups; dtstore is the store alone. The package holds both programs,
 dtrun-srun for SLURM, the training library on libtorch (DDP, FSDP,
 checkpoints, a trainer) and the Python package behind %load_ext dtrun.")
# python3 runs the interactive session package; torch for Python is what
# most workers need, but dtrun launches any program without it.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "python3")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "python3-torch")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "python3-ipykernel")
# Python writes __pycache__ beside the session package; dpkg does not own it.
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian-prerm.in ${CMAKE_BINARY_DIR}/debian/prerm @ONLY)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/debian/prerm)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME dtrun-dev)
set(CPACK_DEBIAN_DEV_DESCRIPTION
  "dtrun's training library and store client: development files
 Headers, CMake package (find_package(dtrun): dtrun::train, dtrun::store) and
 pkg-config files (dtrun, dtrun-store) to build trainers against dtrun's DDP,
 FSDP and checkpoints.")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "dtrun (= ${PROJECT_VERSION}), libtorch-dev")
include(CPack)
