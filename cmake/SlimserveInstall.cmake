# Installs slimserve as a CMake package: find_package(slimserve CONFIG) + slimserve::slimserve.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SLIMSERVE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/slimserve")

install(TARGETS slimserve EXPORT slimserve-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT slimserve-targets NAMESPACE slimserve:: DESTINATION ${SLIMSERVE_INSTALL_CMAKEDIR})

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
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/slimserve)
