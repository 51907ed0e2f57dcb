//! Shared helpers for idempo's workspace tests: locating `spec/vectors` and `../shared` reference data.
use std::path::PathBuf;

pub mod linearize;
pub mod memstore;
pub mod model;
pub mod recipes;

/// The repository root (the folder holding the workspace `Cargo.toml`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate lives one level below the root")
        .to_path_buf()
}

/// `spec/vectors/<sub>` inside the repository.
pub fn vectors_dir(sub: &str) -> PathBuf {
    repo_root().join("spec").join("vectors").join(sub)
}

/// The RFC 8785 reference data in `../shared/vectors/jcs`, when present beside the checkout.
///
/// Returns `None` (after printing a notice) when it is absent: users of the project do not have it.
pub fn shared_jcs_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("IDEMPO_JCS_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            repo_root()
                .join("..")
                .join("shared")
                .join("vectors")
                .join("jcs")
        });
    if dir.join("input").is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "notice: RFC 8785 reference vectors not found at {} (set IDEMPO_JCS_VECTORS); skipping",
            dir.display()
        );
        None
    }
}
