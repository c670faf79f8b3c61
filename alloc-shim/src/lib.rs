//! `liboutcore_shim.so`: the outcore allocation trap for C code, loaded with
//! `LD_PRELOAD`.
//!
//! Not written yet: this crate is a placeholder in the workspace so the
//! layout is in place. See the alloc-shim issue.
