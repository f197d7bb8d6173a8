# The `mallard` command inside the Debian package: pip installs tools/mallard into /usr/lib/python3/dist-packages
# of the staging tree (no dependencies: the package Depends on python3-rich), /usr/bin/mallard starts it.
# MALLARD_PIP_PYTHON is the user's override only; the default is found into a variable of its own (find_program
# does not search when its result variable is already a cache entry, even an empty one).
set(MALLARD_PIP_PYTHON "" CACHE FILEPATH "Python whose pip installs the command (default: .venv's, else python3)")
if(MALLARD_PIP_PYTHON)
  set(mallard_pip_python ${MALLARD_PIP_PYTHON})
elseif(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(mallard_pip_python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
else()
  find_program(MALLARD_PYTHON3 NAMES python3 REQUIRED)
  set(mallard_pip_python ${MALLARD_PYTHON3})
endif()
# With setuptools and wheel at hand the wheel is built offline; without it pip fetches setuptools from PyPI.
execute_process(COMMAND ${mallard_pip_python} -c "import setuptools, wheel" RESULT_VARIABLE no_setuptools OUTPUT_QUIET ERROR_QUIET)
set(isolation "")
if(no_setuptools EQUAL 0)
  set(isolation "--no-build-isolation")
endif()
set(site lib/python3/dist-packages)
install(CODE "
  set(target \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${site}\")
  execute_process(COMMAND \"${mallard_pip_python}\" -m pip install --quiet --no-deps --no-compile ${isolation}
                          --upgrade --target \"\${target}\" \"${PROJECT_SOURCE_DIR}/tools/mallard\"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR \"pip could not install tools/mallard into \${target}\")
  endif()
  file(REMOVE_RECURSE \"\${target}/bin\")
  file(GLOB direct \"\${target}/mallard_cli-*.dist-info/direct_url.json\")  # names the build folder
  file(REMOVE \${direct})" COMPONENT cli)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/packaging/mallard-launcher DESTINATION ${CMAKE_INSTALL_BINDIR}
        RENAME mallard COMPONENT cli)
