# Debian packages through CPack: libmallard0, libmallard-dev, mallard, mallard-global (packaging/build-debs.sh).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME mallard)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "Mallard project")
set(CPACK_PACKAGE_CONTACT "Mallard maintainers <mallard@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev cli global)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_OUTPUT_FILE_PREFIX ${PROJECT_BINARY_DIR}/debs)
set(mallard_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libmallard${MALLARD_SOVERSION})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "Mallard memory allocator - runtime libraries
libmallard.so.0 replaces malloc when preloaded or linked; libmallard-secure.so.0 is the hardened
variant (encoded free lists, double-free detection, canaries, guard pages).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libmallard-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libmallard${MALLARD_SOVERSION} (= ${mallard_deb_version})")
set(CPACK_DEBIAN_DEV_DESCRIPTION "Mallard memory allocator - development files
mallard.h, the static libraries (libmallard.a, libmallard-prefix.a), pkg-config files (mallard,
mallard-secure, mallard-static, mallard-prefix), the CMake package and libmallard(3).")

set(CPACK_DEBIAN_CLI_PACKAGE_NAME mallard)
set(CPACK_DEBIAN_CLI_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_CLI_PACKAGE_DEPENDS
    "libmallard${MALLARD_SOVERSION} (= ${mallard_deb_version}), python3 (>= 3.9), python3-rich, python3-pyelftools")
set(CPACK_DEBIAN_CLI_PACKAGE_RECOMMENDS "python3-matplotlib")
set(CPACK_DEBIAN_CLI_PACKAGE_CONTROL_EXTRA ${mallard_pack_dir}/mallard/prerm)
set(CPACK_DEBIAN_CLI_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_CLI_DESCRIPTION "Mallard memory allocator - the mallard command
Runs programs under any allocator, profiles their allocations (with the mallard tracer), benchmarks
them side by side and explains their virtual memory; mallard-run runs one program on Mallard.")

# One -global package at a time: they all provide malloc-global and conflict with it (and with the known names);
# the preinst also refuses a preload that no package owns (another /etc/profile.d script, /etc/ld.so.preload).
set(CPACK_DEBIAN_GLOBAL_PACKAGE_NAME mallard-global)
set(CPACK_DEBIAN_GLOBAL_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_GLOBAL_PACKAGE_DEPENDS "libmallard${MALLARD_SOVERSION} (= ${mallard_deb_version})")
set(CPACK_DEBIAN_GLOBAL_PACKAGE_PROVIDES "malloc-global")
set(CPACK_DEBIAN_GLOBAL_PACKAGE_CONFLICTS
    "malloc-global, jemalloc-global, libjemalloc-global, mimalloc-global, libmimalloc-global, tcmalloc-global, gperftools-global")
set(CPACK_DEBIAN_GLOBAL_PACKAGE_CONTROL_EXTRA
    ${mallard_pack_dir}/mallard-global/preinst ${mallard_pack_dir}/mallard-global/postinst
    ${mallard_pack_dir}/mallard-global/postrm)
set(CPACK_DEBIAN_GLOBAL_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_GLOBAL_DESCRIPTION "Mallard memory allocator - enable it for every login shell
Installs /etc/profile.d/mallard-global.sh, which appends libmallard.so.0 to LD_PRELOAD in login shells.
Remove the package to go back to the system allocator.")

include(CPack)
