//! The `ctxd` binary: parses the command line and hands over to [`ctxd::cli`].

fn main() -> anyhow::Result<()> {
    ctxd::cli::main()
}
