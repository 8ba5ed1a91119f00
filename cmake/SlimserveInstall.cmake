# Installs slimserve as a CMake package: find_package(slimserve CONFIG) + slimserve::slimserve,
# and slimserve::emulated (every kernel on the CPU emulator) when it was built. Each target has
# its own export file so a consumer asking only for the emulated component needs no CUDA.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SLIMSERVE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/slimserve")

install(TARGETS slimserve EXPORT slimserve-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET slimserve_c)
  install(TARGETS slimserve_c EXPORT slimserve-targets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(EXPORT slimserve-targets NAMESPACE slimserve:: DESTINATION ${SLIMSERVE_INSTALL_CMAKEDIR})
if(TARGET slimserve_emu)
  install(TARGETS slimserve_emu EXPORT slimserve-emulated-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(TARGET slimserve_c_emulated)
    install(TARGETS slimserve_c_emulated EXPORT slimserve-emulated-targets
            LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
  install(EXPORT slimserve-emulated-targets NAMESPACE slimserve::
          DESTINATION ${SLIMSERVE_INSTALL_CMAKEDIR})
endif()

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/slimserveConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/slimserveConfig.cmake"
  INSTALL_DESTINATION ${SLIMSERVE_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/slimserveConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/slimserveConfig.cmake"
              "${PROJECT_BINARY_DIR}/slimserveConfigVersion.cmake"
        DESTINATION ${SLIMSERVE_INSTALL_CMAKEDIR})
if(SLIMSERVE_BUILD_C_API)
  install(FILES "${PROJECT_SOURCE_DIR}/include/slimserve/c/slimserve.h"
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/slimserve/c)
endif()
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/slimserve)
