"""Repository rules that expose libraries installed on the machine to Bazel.

Nothing is downloaded: each rule looks at the local filesystem and writes a
BUILD file. deploy/setup.sh installs what these rules look for.
"""

_SETUP_HINT = "run deploy/setup.sh to install Chorus's dependencies"

def _split_flags(text):
    return [f for f in text.strip().split(" ") if f]

def _pkg_config_repository_impl(ctx):
    pkg_config = ctx.which("pkg-config")
    if pkg_config == None:
        fail("pkg-config not found; " + _SETUP_HINT)
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, modules in ctx.attr.libraries.items():
        libs = ctx.execute([pkg_config, "--libs"] + modules)
        if libs.return_code != 0:
            fail("pkg-config cannot find %s (%s); %s" % (
                " ".join(modules),
                libs.stderr.strip(),
                _SETUP_HINT,
            ))
        cflags = ctx.execute([pkg_config, "--cflags"] + modules)
        defines = [f[2:] for f in _split_flags(cflags.stdout) if f.startswith("-D")]
        linkopts = _split_flags(libs.stdout)
        build.append("cc_library(")
        build.append("    name = %r," % name)
        build.append("    defines = %r," % defines)
        build.append("    linkopts = %r," % linkopts)
        if name in ctx.attr.tsan_deps:
            # Under --config=tsan, the library built from source with
            # ThreadSanitizer comes first (Note in third_party/absl_source.BUILD).
            build.append("    deps = select({")
            build.append("        \"@//:tsan\": %r," % ctx.attr.tsan_deps[name])
            build.append("        \"//conditions:default\": [],")
            build.append("    }),")
        build.append(")")
        build.append("")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", "\n".join(build))

pkg_config_repository = repository_rule(
    implementation = _pkg_config_repository_impl,
    attrs = {
        "libraries": attr.string_list_dict(mandatory = True),
        # library name -> labels linked in with it under --config=tsan.
        "tsan_deps": attr.string_list_dict(),
    },
    local = True,
)

def _libtorch_repository_impl(ctx):
    home = ctx.os.environ.get("LIBTORCH_HOME", "")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    if home:
        include = ctx.path(home + "/include")
        lib = ctx.path(home + "/lib")
        if not include.exists or not lib.exists:
            fail("LIBTORCH_HOME=%s has no include/ and lib/ directories" % home)
        ctx.symlink(include, "include")
        includes = ["include", "include/torch/csrc/api/include"]
        hdrs = 'glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"])'
        linkopts = ["-L" + str(lib), "-Wl,-rpath," + str(lib)]
        has_cuda = ctx.path(home + "/lib/libtorch_cuda.so").exists
        if has_cuda:
            linkopts += ["-Wl,--no-as-needed", "-ltorch_cuda", "-lc10_cuda", "-Wl,--as-needed"]
    else:
        api = ctx.path("/usr/include/torch/csrc/api/include")
        if not api.exists:
            fail("LibTorch headers not found at %s; %s, or set LIBTORCH_HOME" % (api, _SETUP_HINT))
        ctx.symlink(api, "api_include")
        includes = ["api_include"]
        hdrs = 'glob(["api_include/**/*.h"])'
        linkopts = []
        has_cuda = False

    linkopts += ["-ltorch", "-ltorch_cpu", "-lc10"]
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "libtorch",
    hdrs = {hdrs},
    includes = {includes},
    linkopts = {linkopts},
)

# True when this LibTorch was built with CUDA.
config_setting(
    name = "has_cuda",
    define_values = {{"libtorch_has_cuda": "{has_cuda}"}},
)
""".format(hdrs = hdrs, includes = repr(includes), linkopts = repr(linkopts), has_cuda = "1" if has_cuda else "0"))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["LIBTORCH_HOME"],
    local = True,
)

def _cuda_repository_impl(ctx):
    home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    include = ctx.path(home + "/include")
    lib = ctx.path(home + "/lib64")
    if include.exists and lib.exists:
        ctx.symlink(include, "include")
        libdir = str(lib.realpath)
        found = True
    else:
        ctx.file("include/.missing", "")
        libdir = home + "/lib64"
        found = False
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

# CUDA {home} found: {found}. Only --config=cuda targets depend on these.
cc_library(
    name = "cudart",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/*.h", "include/crt/*.hpp", "include/nv/**"]),
    includes = ["include"],
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lcudart"],
)

cc_library(
    name = "nccl",
    hdrs = glob(["include/nccl*.h"]),
    includes = ["include"],
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lnccl"],
    deps = [":cudart"],
)
""".format(home = home, found = found, libdir = libdir))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["CUDA_HOME"],
    local = True,
)

def _absl_source_repository_impl(ctx):
    home = ctx.os.environ.get("CHORUS_ABSL_SOURCE", "/usr/local/src/chorus/abseil")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    absl = ctx.path(home + "/absl")
    if not absl.exists:
        fail(("Abseil's source (Debian's, the installed libabsl-dev's version) is not at %s; " +
              "--config=tsan builds it with ThreadSanitizer. %s, or set CHORUS_ABSL_SOURCE") %
             (home, _SETUP_HINT))
    # A copy without Abseil's own BUILD files, so that one glob() in
    # absl_source.BUILD sees the whole tree as one package.
    copied = ctx.execute(["cp", "-R", str(absl), "absl"])
    if copied.return_code != 0:
        fail("cannot copy %s: %s" % (absl, copied.stderr))
    ctx.execute(["find", "absl", "(", "-name", "BUILD", "-o", "-name", "BUILD.bazel", ")", "-delete"])
    ctx.symlink(ctx.attr.build_file, "BUILD")

# Abseil built from its Debian source package, for --config=tsan only.
absl_source_repository = repository_rule(
    implementation = _absl_source_repository_impl,
    attrs = {"build_file": attr.label(mandatory = True, allow_single_file = True)},
    environ = ["CHORUS_ABSL_SOURCE"],
    local = True,
)
