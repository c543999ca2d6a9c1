# cython: language_level=3, freethreading_compatible=True
"""What the running CPU supports and which compiler built this package.

Compiled with the portable baseline flags only, so that it is safe to import
on any CPU; it decides which ``_isa_<variant>`` module may be loaded.
"""

cdef extern from *:
    """
    #if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    #include <cpuid.h>
    #include <string.h>
    /* The state components the OS saves on a context switch (XCR0), or 0
       when it does not say (no OSXSAVE).  An instruction set is usable only
       if the OS saves its registers: ymm (SSE, AVX: bits 1-2) for AVX2,
       also opmask and zmm (bits 5-7) for AVX-512. */
    static unsigned long long posenc_xcr0(void) {
        unsigned int a, b, c, d, lo, hi;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        return ((unsigned long long)hi << 32) | lo;
    }
    static int posenc_cpu_has(int which) {
        unsigned long long xcr0 = posenc_xcr0();
        __builtin_cpu_init();
        switch (which) {
        case 0: return (xcr0 & 0x6) == 0x6
                    && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        case 1: return (xcr0 & 0xe6) == 0xe6
                    && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                    && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
        case 2: {  /* AVX512_BF16: CPUID leaf 7 subleaf 1, EAX bit 5 (older compilers lack its name) */
            unsigned int a = 0, b, c, d;
            return posenc_cpu_has(1) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
        }
        }
        return 0;
    }
    /* Vendor string (12 characters and a NUL) and the display family and
       model of CPUID leaf 1 (extended fields folded in as Intel and AMD
       document them). */
    static void posenc_cpu_identity(char* vendor, int* family, int* model) {
        unsigned int a = 0, b = 0, c = 0, d = 0, base_family, base_model;
        vendor[0] = 0;
        *family = *model = 0;
        if (!__get_cpuid(0, &a, &b, &c, &d)) return;
        memcpy(vendor, &b, 4);
        memcpy(vendor + 4, &d, 4);
        memcpy(vendor + 8, &c, 4);
        vendor[12] = 0;
        if (!__get_cpuid(1, &a, &b, &c, &d)) return;
        base_family = (a >> 8) & 0xf;
        base_model = (a >> 4) & 0xf;
        *family = (int)(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
        *model = (int)(base_family == 0x6 || base_family == 0xf
                       ? base_model | (((a >> 16) & 0xf) << 4) : base_model);
    }
    #else
    static int posenc_cpu_has(int which) { (void)which; return 0; }
    static void posenc_cpu_identity(char* vendor, int* family, int* model) {
        vendor[0] = 0;
        *family = *model = 0;
    }
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
    void posenc_cpu_identity(char* vendor, int* family, int* model) nogil
    const char* POSENC_COMPILER


def cpu_supports():
    """Return the names of the kernel variants the running CPU (and its OS) can execute."""
    names = ["baseline"]
    if posenc_cpu_has(0):
        names.append("avx2")
    if posenc_cpu_has(1):
        names.append("avx512")
    if posenc_cpu_has(2):
        names.append("avx512bf16")
    return names


def cpu_identity():
    """Return (vendor, family, model) of an x86 CPU from CPUID, or ("", 0, 0) elsewhere.

    vendor is e.g. "AuthenticAMD" or "GenuineIntel"; family and model are the
    display values (AMD Zen 5: family 0x1A).
    """
    cdef char vendor[13]
    cdef int family, model
    posenc_cpu_identity(vendor, &family, &model)
    return vendor.decode("latin-1"), family, model


def compiler():
    """Return the compiler (name and version) that built the extensions."""
    return POSENC_COMPILER.decode(errors="replace")
