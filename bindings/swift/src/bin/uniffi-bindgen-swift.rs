//! Swift bindings generator for `idempo-swift` (uniffi library mode).
//!
//! Reads the uniffi metadata from the symbol table of an unstripped build of the library and writes
//! the Swift sources, the C header and the modulemap. `scripts/swift-bindings.sh` drives it.
fn main() {
    uniffi::uniffi_bindgen_swift();
}
