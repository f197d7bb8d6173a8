# cmake/toolchain-aarch64.cmake — cross build for aarch64 Linux (glibc) with Debian's gcc-aarch64-linux-gnu, tests run under qemu-aarch64-static.
# Use: cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake (docs/PLATFORMS.md).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(MALLARD_AARCH64_TRIPLE aarch64-linux-gnu CACHE STRING "GNU triple of the aarch64 cross compiler")
set(MALLARD_AARCH64_SYSROOT /usr/${MALLARD_AARCH64_TRIPLE} CACHE PATH
    "The aarch64 C library's root (Debian's libc6-dev-arm64-cross): qemu's -L and CMake's find root")
set(CMAKE_C_COMPILER ${MALLARD_AARCH64_TRIPLE}-gcc)

# Headers and libraries from the cross sysroot only; programs (python, sh) from the host.
set(CMAKE_FIND_ROOT_PATH ${MALLARD_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest (and try_run) start every aarch64 program through qemu-user; -L: where the guest's ld.so and libc live.
# The environment (LD_PRELOAD, MALLARD_CONF) passes through qemu, a static program, to the guest's loader.
find_program(MALLARD_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(MALLARD_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MALLARD_QEMU_AARCH64} -L ${MALLARD_AARCH64_SYSROOT})
else()
  message(WARNING "qemu-aarch64-static not found (apt-get install qemu-user-static): the aarch64 tests cannot run here")
endif()
