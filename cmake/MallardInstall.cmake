# Installation of Mallard: libraries with versioned sonames, header, pkg-config files, CMake package, tracer,
# mallard-run, man pages, the /etc/profile.d switch, and the Debian packages CPack makes from them (docs/INSTALL.md).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MALLARD_SOVERSION 0)
set(MALLARD_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mallard)
set(mallard_pack_dir ${PROJECT_SOURCE_DIR}/packaging)

# Components are the Debian packages: runtime = libmallard0, dev = libmallard-dev, cli = mallard, global = mallard-global.
set_target_properties(mallard mallard-secure PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${MALLARD_SOVERSION})
set_target_properties(mallard PROPERTIES EXPORT_NAME mallard)
set_target_properties(mallard-secure PROPERTIES EXPORT_NAME secure)
set_target_properties(mallard-static PROPERTIES EXPORT_NAME static)
set_target_properties(mallard-prefix PROPERTIES EXPORT_NAME prefix)
# The targets carry the source tree's include folder; an installed package must point at its own instead.
foreach(t mallard mallard-secure mallard-static mallard-prefix)
  set_property(TARGET ${t} PROPERTY INTERFACE_INCLUDE_DIRECTORIES
               $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()

install(TARGETS mallard mallard-secure EXPORT mallardTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(TARGETS mallard-static mallard-prefix EXPORT mallardTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/include/mallard.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

# CMake package: find_package(mallard CONFIG) gives mallard::mallard, mallard::secure, mallard::static, mallard::prefix.
install(EXPORT mallardTargets NAMESPACE mallard:: DESTINATION ${MALLARD_CMAKEDIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mallardConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/mallardConfig.cmake INSTALL_DESTINATION ${MALLARD_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/mallardConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/mallardConfig.cmake ${PROJECT_BINARY_DIR}/cmake/mallardConfigVersion.cmake
        DESTINATION ${MALLARD_CMAKEDIR} COMPONENT dev)

# pkg-config: one file per variant, written at install time so that it names the prefix really installed into.
set(MALLARD_SYSTEM_LIBDIRS ${CMAKE_C_IMPLICIT_LINK_DIRECTORIES} /lib /usr/lib /lib64 /usr/lib64)
foreach(pc
    "mallard|shared|mallard|Mallard memory allocator (replaces malloc, prefixed API in mallard.h)"
    "mallard-secure|shared|mallard-secure|Mallard memory allocator, hardened variant (replaces malloc)"
    "mallard-static|static|mallard|Mallard memory allocator, static library (replaces malloc in the program)"
    "mallard-prefix|static|mallard-prefix|Mallard memory allocator, prefixed API only (beside the system malloc)")
  string(REPLACE "|" ";" f "${pc}")
  list(GET f 0 name)
  list(GET f 1 kind)
  list(GET f 2 libname)
  list(GET f 3 description)
  set(out ${PROJECT_BINARY_DIR}/pkgconfig/${name}.pc)
  install(CODE "
    set(PC_TEMPLATE \"${CMAKE_CURRENT_LIST_DIR}/mallard.pc.in\")
    set(PC_OUT \"${out}\")
    set(PC_NAME \"${name}\")
    set(PC_DESCRIPTION \"${description}\")
    set(PC_KIND \"${kind}\")
    set(PC_LIBNAME \"${libname}\")
    set(PROJECT_VERSION \"${PROJECT_VERSION}\")
    set(MALLARD_LIBDIR_REL \"${CMAKE_INSTALL_LIBDIR}\")
    set(MALLARD_INCLUDEDIR_REL \"${CMAKE_INSTALL_INCLUDEDIR}\")
    set(MALLARD_SYSTEM_LIBDIRS \"${MALLARD_SYSTEM_LIBDIRS}\")
    include(\"${CMAKE_CURRENT_LIST_DIR}/MallardWritePc.cmake\")" COMPONENT dev)
  install(FILES ${out} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()

# The command's helpers: the profiler's tracer beside libmallard.so (the command looks there), the measuring launcher.
if(TARGET mallard-tracer)
  install(TARGETS mallard-tracer LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cli)
endif()
if(TARGET mallard-measure)
  install(TARGETS mallard-measure RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()

# mallard-run CMD...: one program on Mallard; it finds the library relative to itself, wherever installed.
file(RELATIVE_PATH MALLARD_BIN_TO_LIB ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}
     ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR})
configure_file(${mallard_pack_dir}/mallard-run.in ${PROJECT_BINARY_DIR}/packaging/mallard-run @ONLY)
install(PROGRAMS ${PROJECT_BINARY_DIR}/packaging/mallard-run DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)

# Man pages.
install(FILES ${PROJECT_SOURCE_DIR}/docs/man/mallard.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/docs/man/mallard.conf.5 DESTINATION ${CMAKE_INSTALL_MANDIR}/man5 COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/docs/man/libmallard.3 DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT dev)

# The global switch: /etc/profile.d/mallard-global.sh preloads the installed libmallard.so.0 for login shells.
# Only installed on request (-DMALLARD_INSTALL_GLOBAL=ON, as the Debian build does): it changes every login.
option(MALLARD_INSTALL_GLOBAL "cmake --install also writes /etc/profile.d/mallard-global.sh" OFF)
set(MALLARD_GLOBAL_LIB ${CMAKE_INSTALL_FULL_LIBDIR}/libmallard.so.${MALLARD_SOVERSION})
configure_file(${mallard_pack_dir}/mallard-global.sh.in ${PROJECT_BINARY_DIR}/packaging/mallard-global.sh @ONLY)
if(MALLARD_INSTALL_GLOBAL)
  install(FILES ${PROJECT_BINARY_DIR}/packaging/mallard-global.sh DESTINATION /etc/profile.d COMPONENT global)
endif()

# The `mallard` command itself goes into the Debian package only (pip installs it elsewhere: docs/INSTALL.md).
option(MALLARD_PACKAGE_CLI "Install the Python command into lib/python3/dist-packages (the Debian package build)" OFF)
if(MALLARD_PACKAGE_CLI)
  include(${CMAKE_CURRENT_LIST_DIR}/MallardPackageCli.cmake)
endif()

include(${CMAKE_CURRENT_LIST_DIR}/MallardDebian.cmake)
