# Install rules: headers, the exported kvsift::kvsift target, and a relocatable package config so
# `find_package(kvsift CONFIG REQUIRED)` works from any install prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvsift DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvsift EXPORT kvsiftTargets)
install(EXPORT kvsiftTargets NAMESPACE kvsift:: DESTINATION ${CMAKE_INSTALL_DATADIR}/cmake/kvsift)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvsiftConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvsiftConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_DATADIR}/cmake/kvsift)
# Header-only: the package fits any architecture, so no pointer-size check.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvsiftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/kvsiftConfig.cmake ${PROJECT_BINARY_DIR}/kvsiftConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_DATADIR}/cmake/kvsift)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
