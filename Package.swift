// swift-tools-version:6.0
// The idempo Swift package (iOS/macOS clients; builds and tests on Linux too).
//
// It lives at the repository root so it can be added by git URL; its sources are in bindings/swift
// (see bindings/swift/README.md). Targets:
//   Idempo          the idiomatic API: IdempotencyKey, Fingerprint, CanonicalJSON, RetryPolicy,
//                   IdempotentClient with a PendingKeyStore (the only product)
//   IdempoBindings  uniffi-generated Swift over the Rust FFI (generated, never edited)
//   IdempoFFI       the C module of the FFI: on Linux the generated header + modulemap, linking
//                   libidempo_swift.a built by cargo (pass its folder with -Xlinker -L<dir>);
//                   on Apple platforms the XCFramework made by scripts/build-xcframework.sh
//                   (bindings/swift/IdempoFFI.xcframework), or a released one when
//                   IDEMPO_FFI_URL and IDEMPO_FFI_CHECKSUM are set.
import PackageDescription

#if os(Linux)
let ffiTarget: Target = .systemLibrary(name: "IdempoFFI", path: "bindings/swift/Sources/IdempoFFI")
#else
let ffiTarget: Target = {
    if let url = Context.environment["IDEMPO_FFI_URL"], let checksum = Context.environment["IDEMPO_FFI_CHECKSUM"] {
        return .binaryTarget(name: "IdempoFFI", url: url, checksum: checksum)
    }
    return .binaryTarget(name: "IdempoFFI", path: "bindings/swift/IdempoFFI.xcframework")
}()
#endif

let package = Package(
    name: "Idempo",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "Idempo", targets: ["Idempo"]),
    ],
    targets: [
        ffiTarget,
        .target(
            name: "IdempoBindings",
            dependencies: ["IdempoFFI"],
            path: "bindings/swift/Sources/IdempoBindings",
            linkerSettings: [.linkedLibrary("idempo_swift", .when(platforms: [.linux]))]
        ),
        .target(
            name: "Idempo",
            dependencies: ["IdempoBindings"],
            path: "bindings/swift/Sources/Idempo"
        ),
        .testTarget(
            name: "IdempoTests",
            dependencies: ["Idempo", "IdempoBindings"],
            path: "bindings/swift/Tests/IdempoTests"
        ),
    ],
    swiftLanguageModes: [.v6]
)
