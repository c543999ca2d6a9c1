# cython: language_level=3, freethreading_compatible=True
"""What the running CPU supports and which compiler built this package.

Compiled with the portable baseline flags only, so that it is safe to import
on any CPU; it decides which ``_isa_<variant>`` module may be loaded.
"""

cdef extern from *:
    """
    #if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    static int posenc_cpu_has(int which) {
        __builtin_cpu_init();
        switch (which) {
        case 0: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        case 1: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                    && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
        }
        return 0;
    }
    #else
    static int posenc_cpu_has(int which) { (void)which; return 0; }
    #endif
    #if defined(__clang__)
    #define POSENC_COMPILER "clang " __clang_version__
    #elif defined(__GNUC__)
    #define POSENC_COMPILER "gcc " __VERSION__
    #elif defined(_MSC_VER)
    #define POSENC_COMPILER "msvc"
    #else
    #define POSENC_COMPILER "unknown"
    #endif
    """
    int posenc_cpu_has(int which) nogil
    const char* POSENC_COMPILER


def cpu_supports():
    """Return the names of the kernel variants the running CPU can execute."""
    names = ["baseline"]
    if posenc_cpu_has(0):
        names.append("avx2")
    if posenc_cpu_has(1):
        names.append("avx512")
    return names


def compiler():
    """Return the compiler (name and version) that built the extensions."""
    return POSENC_COMPILER.decode(errors="replace")
