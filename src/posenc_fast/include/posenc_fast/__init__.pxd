# Makes this folder the package posenc_fast for cimport (see capi.pxd).
