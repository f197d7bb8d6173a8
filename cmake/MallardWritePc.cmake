# Install-time script: writes one pkg-config file for the prefix `cmake --install` really uses (--prefix, DESTDIR).
# In: PC_TEMPLATE, PC_OUT, PC_NAME, PC_DESCRIPTION, PC_KIND (shared|static), PC_LIBNAME, PROJECT_VERSION,
#     MALLARD_LIBDIR_REL, MALLARD_INCLUDEDIR_REL, MALLARD_SYSTEM_LIBDIRS, CMAKE_INSTALL_PREFIX.
set(PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(PC_LIBDIR "${CMAKE_INSTALL_PREFIX}/${MALLARD_LIBDIR_REL}")
set(PC_INCLUDEDIR "${CMAKE_INSTALL_PREFIX}/${MALLARD_INCLUDEDIR_REL}")
if(PC_KIND STREQUAL "static")
  # The archive by full path: -lmallard would pick libmallard.so when both are installed.
  set(PC_LIBS "\${libdir}/lib${PC_LIBNAME}.a -lpthread")
else()
  set(PC_LIBS "-L\${libdir} -l${PC_LIBNAME}")
  # Outside the loader's default folders a consumer could not start: the run path goes with the link flags.
  list(FIND MALLARD_SYSTEM_LIBDIRS "${PC_LIBDIR}" system_index)
  if(system_index EQUAL -1)
    string(APPEND PC_LIBS " -Wl,-rpath,\${libdir}")
  endif()
endif()
configure_file("${PC_TEMPLATE}" "${PC_OUT}" @ONLY)
