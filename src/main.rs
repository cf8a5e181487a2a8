//! The `ctxd` binary: parses the command line and hands over to [`ctxd::cli`].

fn main() -> anyhow::Result<()> {
    large_buffers_are_returned();
    ctxd::cli::main()
}

/// glibc raises its mmap threshold each time a large mapped buffer is freed, after which
/// buffers of that size come from the heap arenas and stay with the process when freed: a
/// gateway request of 50 MiB would leave the server holding several times that. A fixed
/// threshold keeps every buffer of a mebibyte or more mapped, so it is returned when freed.
#[allow(unsafe_code)]
fn large_buffers_are_returned() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}
