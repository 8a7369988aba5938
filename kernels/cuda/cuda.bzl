"""cuda_library: compile .cu files with nvcc from /usr/local/cuda and wrap the objects in a cc_library.

Each .cu becomes one genrule (so Bazel compiles them in parallel) producing a relocatable object with
machine code for sm_90 (H200, where we measure) and sm_120 (RTX PRO 2000, the reference deployment's card). The
objects are then linked like any C++ object; the cc_library depends on //third_party:cuda_runtime.
Headers listed in `hdrs` and `cu_hdrs` are visible to nvcc; `cu_hdrs` stay private to the .cu files.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = " ".join([
    "-O3",
    "-lineinfo",
    "-std=c++20",
    "-Xcompiler -fPIC",
    "-Xcompiler -O2",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_120,code=sm_120",
    "--expt-relaxed-constexpr",
    "-I.",
])

def cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [], copts = [], **kwargs):
    objs = []
    for src in srcs:
        base = src[:-len(".cu")] if src.endswith(".cu") else src
        obj = base + ".cu.o"
        native.genrule(
            name = name + "_" + base.replace("/", "_") + "_nvcc",
            srcs = [src] + hdrs + cu_hdrs,
            outs = [obj],
            cmd = "%s %s %s -c $(location %s) -o $@" % (NVCC, NVCC_FLAGS, " ".join(copts), src),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        **kwargs
    )
