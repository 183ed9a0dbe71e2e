"""cuda_cc_library: a C++ library whose sources use CUDA under --config=cuda.

Note [CUDA headers stay in their library]
A cc_library that depends on @cuda//:cudart hands CUDA's include path and
headers to every library and test above it, so each of their compile actions
differs between --config=cuda and the default configuration, and a build of
both (CI builds both) compiles everything above the GPU code twice. Only the
few sources that include CUDA headers need them. So cuda_cc_library compiles
`srcs` with CUDA (NAME_cuda, private) and gives the libraries above it only
what links them (NAME_objects: its objects and CUDA's libraries), next to
`deps` for its headers (NAME). Its headers must therefore not include CUDA's.
"""

def _link_only_impl(ctx):
    return [CcInfo(linking_context = ctx.attr.dep[CcInfo].linking_context)]

# Forwards what links `dep` (objects, libraries, link options), not what
# compiles against it.
_cc_link_only = rule(
    implementation = _link_only_impl,
    attrs = {"dep": attr.label(mandatory = True, providers = [CcInfo])},
)

def cuda_cc_library(name, srcs, hdrs, deps, cuda_deps, visibility = None, **kwargs):
    """A cc_library NAME whose srcs are compiled with CHORUS_WITH_CUDA and
    `cuda_deps` (@cuda//...) under --config=cuda (Note [CUDA headers stay in
    their library]). kwargs go to the library that compiles srcs."""
    native.cc_library(
        name = name + "_cuda",
        srcs = srcs,
        hdrs = hdrs,
        local_defines = select({
            "//:cuda": ["CHORUS_WITH_CUDA"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//:cuda": cuda_deps,
            "//conditions:default": [],
        }),
        visibility = ["//visibility:private"],
        **kwargs
    )
    _cc_link_only(
        name = name + "_objects",
        dep = ":" + name + "_cuda",
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        hdrs = hdrs,
        deps = deps + [":" + name + "_objects"],
        visibility = visibility,
    )
