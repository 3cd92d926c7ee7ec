// swift-tools-version: 6.1
// libFuzzer targets for every decoder that the radio, the PAM socket or the config file feeds. Built only by scripts/fuzz, with
// -sanitize=fuzzer, so `swift build` of the main package never sees them.
import PackageDescription

let fuzzerFlags: [SwiftSetting] = [.unsafeFlags(["-parse-as-library"])]

let package = Package(
    name: "BoxkeyFuzz",
    dependencies: [.package(name: "Boxkey", path: "..")],
    targets: [
        .executableTarget(name: "FuzzFragments", dependencies: [.product(name: "BoxkeyCore", package: "Boxkey")], swiftSettings: fuzzerFlags),
        .executableTarget(name: "FuzzMessages", dependencies: [.product(name: "BoxkeyCore", package: "Boxkey")], swiftSettings: fuzzerFlags),
        .executableTarget(name: "FuzzHandshake", dependencies: [.product(name: "BoxkeyCore", package: "Boxkey")], swiftSettings: fuzzerFlags),
        .executableTarget(name: "FuzzPAMWire", dependencies: [.product(name: "BoxkeyPAMWire", package: "Boxkey")], swiftSettings: fuzzerFlags),
        .executableTarget(name: "FuzzConfig", dependencies: [.product(name: "BoxkeyDaemon", package: "Boxkey")], swiftSettings: fuzzerFlags),
    ]
)
