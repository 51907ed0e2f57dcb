//! The `idempo` command-line tool.
fn main() {
    eprintln!("idempo: the CLI is being built; see README.md");
    std::process::exit(2);
}
