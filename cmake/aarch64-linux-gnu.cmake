# Cross-compiling qforge's host code for aarch64 Linux (the DGX Spark's Grace CPU) on an x86-64
# Debian machine: g++-aarch64-linux-gnu, the arm64 -dev packages of the libraries (multiarch,
# `dpkg --add-architecture arm64`) and qemu-user to run the tests. `make aarch64` uses it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Libraries and headers from the arm64 multiarch directories; programs from the build machine.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# ctest runs the test binaries through qemu (-L /: the arm64 loader and libraries of multiarch;
# the cross sysroot's loader would not match them).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)
