# Third-party dependencies, all from Debian packages. Header-only or static where the binary travels to
# machines without -dev packages (fmt header-only, nlohmann-json header-only, liburing.a).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
# fmt's headers without its library and without FMT_HEADER_ONLY: src/common/fmt_compiled.cpp compiles fmt's
# formatting engine once into the core, which every part of the tree links (header-only mode compiled it again
# in every file that formats). Nothing of fmt reaches an installed file or a program's run-time needs.
add_library(gdskit_fmt INTERFACE)
get_target_property(GDSKIT_FMT_INCLUDE fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
target_include_directories(gdskit_fmt SYSTEM INTERFACE ${GDSKIT_FMT_INCLUDE})
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)

set(GDSKIT_HAVE_URING OFF)
if(GDSKIT_WITH_URING)
  find_path(URING_INCLUDE_DIR liburing.h)
  find_library(URING_STATIC_LIBRARY NAMES liburing.a)
  find_library(URING_LIBRARY NAMES uring)
  if(URING_INCLUDE_DIR AND (URING_STATIC_LIBRARY OR URING_LIBRARY))
    set(GDSKIT_HAVE_URING ON)
    if(URING_STATIC_LIBRARY)
      message(STATUS "gdskit: io_uring engine enabled (built in from ${URING_STATIC_LIBRARY})")
    else()
      message(STATUS "gdskit: io_uring engine enabled (${URING_LIBRARY})")
    endif()
  else()
    message(STATUS "gdskit: liburing not found; only the thread engine is built")
  endif()
endif()

# gdskit_link_uring(target): builds liburing into `target`. With liburing.a its members become objects of the
# target (Debian builds them position independent), so neither the static nor the shared gdskit asks its users
# for liburing. With only liburing.so, the library is linked by name and a static gdskit lists it for its users.
function(gdskit_link_uring target)
  if(URING_STATIC_LIBRARY)
    set(dir ${PROJECT_BINARY_DIR}/liburing-objects)
    set(stamp ${dir}/.extracted)
    if(NOT EXISTS ${stamp} OR ${URING_STATIC_LIBRARY} IS_NEWER_THAN ${stamp})
      file(REMOVE_RECURSE ${dir})
      file(MAKE_DIRECTORY ${dir}/members)
      execute_process(COMMAND ${CMAKE_AR} x ${URING_STATIC_LIBRARY} WORKING_DIRECTORY ${dir}/members
                      RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "gdskit: cannot extract ${URING_STATIC_LIBRARY} (${CMAKE_AR} x: ${rc})")
      endif()
      # Members are named *.ol (libtool style): CMake takes only *.o as objects.
      file(GLOB members ${dir}/members/*)
      foreach(m ${members})
        get_filename_component(name ${m} NAME_WE)
        file(RENAME ${m} ${dir}/uring_${name}.o)
      endforeach()
      file(TOUCH ${stamp})
    endif()
    file(GLOB objects ${dir}/uring_*.o)
    target_sources(${target} PRIVATE ${objects})
  else()
    get_target_property(type ${target} TYPE)
    target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:${URING_LIBRARY}>)
    if(type STREQUAL "STATIC_LIBRARY")
      target_link_libraries(${target} INTERFACE $<INSTALL_INTERFACE:uring>)
    endif()
  endif()
endfunction()
