# What `cmake --install` puts under the prefix: the CLI (component cli), the library, its headers, the CMake
# package and gdskit.pc (component development). Every installed path is relative to the prefix, so an
# installed tree works wherever it is moved.
include(CMakePackageConfigHelpers)
set(GDSKIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gdskit)

install(TARGETS gdskit EXPORT gdskitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development NAMELINK_COMPONENT development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT development)
if(GDSKIT_BUILD_CLI)
  # The program carries the core within it (the tools use its internals), shared build or not.
  install(TARGETS gdskit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()
install(DIRECTORY include/gdskit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(FILES ${PROJECT_BINARY_DIR}/include/gdskit/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gdskit
        COMPONENT development)
install(EXPORT gdskitTargets NAMESPACE gdskit:: DESTINATION ${GDSKIT_CMAKE_DIR} COMPONENT development)
configure_package_config_file(cmake/gdskitConfig.cmake.in ${PROJECT_BINARY_DIR}/gdskitConfig.cmake
                              INSTALL_DESTINATION ${GDSKIT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gdskitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gdskitConfig.cmake ${PROJECT_BINARY_DIR}/gdskitConfigVersion.cmake
        DESTINATION ${GDSKIT_CMAKE_DIR} COMPONENT development)

# gdskit.pc finds the prefix from its own place (${pcfiledir}), as the CMake package does.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "gdskit: CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR must be relative to the prefix")
endif()
file(RELATIVE_PATH GDSKIT_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" GDSKIT_PC_TO_PREFIX "${GDSKIT_PC_TO_PREFIX}")
set(GDSKIT_PC_LIBS "-lgdskit")
set(GDSKIT_PC_LIBS_PRIVATE -pthread)
foreach(lib ${CMAKE_DL_LIBS})
  list(APPEND GDSKIT_PC_LIBS_PRIVATE -l${lib})
endforeach()
list(JOIN GDSKIT_PC_LIBS_PRIVATE " " GDSKIT_PC_LIBS_PRIVATE)
if(NOT BUILD_SHARED_LIBS)
  # A static library's own dependencies go on its users' link line.
  string(APPEND GDSKIT_PC_LIBS " ${GDSKIT_PC_LIBS_PRIVATE}")
  if(GDSKIT_HAVE_URING AND NOT URING_STATIC_LIBRARY)
    string(APPEND GDSKIT_PC_LIBS " -luring")
  endif()
endif()
configure_file(cmake/gdskit.pc.in ${PROJECT_BINARY_DIR}/gdskit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/gdskit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
