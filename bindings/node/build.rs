//! Emits the linker settings an N-API addon needs on the current platform.
fn main() {
    napi_build::setup();
}
