# cmake/MallardMusl.cmake — builds against musl (CC=musl-gcc, Alpine's gcc): finds out whether the C library is
# glibc, and sets what the musl routes need (docs/COMPATIBILITY.md, "musl"). Sets MALLARD_MUSL (ON: not glibc) and
# MALLARD_MUSL_STATIC (ON: programs can be linked -static, the tests' "static" mode then does). Included by the
# top-level CMakeLists.txt before src/ and again by tests/c (once: include_guard); when it comes after the
# libraries were defined, it adds its link options to them.
include_guard(GLOBAL)
include(CheckCSourceCompiles)

# musl defines no macro of its own (on purpose): a Linux C library that is not glibc (nor uClibc, which poses as
# glibc) is taken for musl; -DMALLARD_MUSL=ON/OFF overrides.
check_c_source_compiles([[
#include <features.h>
#if !defined(__GLIBC__) || defined(__UCLIBC__)
#error not glibc
#endif
int main(void) { return 0; }
]] MALLARD_LIBC_GLIBC)
if(MALLARD_LIBC_GLIBC)
  set(mallard_musl_default OFF)
else()
  set(mallard_musl_default ON)
endif()
option(MALLARD_MUSL "The C library is musl (default: detected)" ${mallard_musl_default})

if(MALLARD_MUSL)
  set(CMAKE_REQUIRED_LINK_OPTIONS -static)
  check_c_source_compiles("int main(void) { return 0; }" MALLARD_MUSL_STATIC)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  message(STATUS "C library: musl (static programs: ${MALLARD_MUSL_STATIC})")
  # musl-gcc's link spec drops gcc's --eh-frame-hdr: without PT_GNU_EH_FRAME an unwinder (libgcc's, LLVM's) finds no
  # frame of the object, and libgcc's aborts when its own is missing. Every musl program and library of this build
  # gets one, so that profiles through a linked-in unwinder have whole stacks (Alpine's gcc passes it already).
  add_link_options(-Wl,--eh-frame-hdr)
  foreach(lib mallard mallard-secure mallard-nostats)
    if(TARGET ${lib})
      target_link_options(${lib} PRIVATE -Wl,--eh-frame-hdr)
    endif()
  endforeach()
else()
  set(MALLARD_MUSL_STATIC OFF)
endif()
