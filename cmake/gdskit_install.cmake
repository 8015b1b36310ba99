include(CMakePackageConfigHelpers)
install(TARGETS gdskit gdskit_cli EXPORT gdskitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/gdskit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/gdskit/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gdskit)
install(EXPORT gdskitTargets NAMESPACE gdskit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gdskit)
configure_package_config_file(cmake/gdskitConfig.cmake.in ${PROJECT_BINARY_DIR}/gdskitConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gdskit)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gdskitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gdskitConfig.cmake ${PROJECT_BINARY_DIR}/gdskitConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gdskit)
