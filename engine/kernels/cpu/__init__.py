"""The engine's own CPU kernels, in C: one library (every .c here and ``pagoda_kernels.h``) compiled
at first use by the machine's C compiler for the machine's own instruction set (``-march=native``),
cached, and called through ctypes with the signatures native.py declares.

Nothing here needs torch's headers, so a build takes seconds; without a compiler, or on a CPU
without AVX2/FMA/F16C, ``native.library()`` returns None and the engine keeps torch's kernels.
PAGODA_NATIVE_KERNELS=0 turns them off. cpu_info.py says what the CPU has (its ISA flags, under
PAGODA_MAX_CPU_ISA, and its memory): the build's target, and the engine's choice of dtype.
"""
