// swift-tools-version: 6.1
import PackageDescription

// Layers, bottom to top (nothing points back up):
//   C libraries (system-library targets)  ->  BoxkeyCore (pure: crypto, Noise, wire format, state machines)
//   -> BoxkeyRadio (radio interface + simulated radio)  ->  executables and the PAM module.
let package = Package(
    name: "Boxkey",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "BoxkeyCore", targets: ["BoxkeyCore"]),
        .library(name: "BoxkeyRadio", targets: ["BoxkeyRadio", "BoxkeySimRadio"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
    ],
    targets: [
        // C libraries from Debian, wrapped as system-library targets.
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),

        // The pure core: no sockets, no D-Bus, no clocks of its own (time is passed in).
        .target(
            name: "BoxkeyCore",
            dependencies: ["CSodium"]
        ),

        // The radio interface both transports implement (BlueZ, simulated).
        .target(name: "BoxkeyRadio"),

        // The simulated radio: in-process and between processes on one machine.
        .target(name: "BoxkeySimRadio", dependencies: [
            "BoxkeyRadio",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOExtras", package: "swift-nio-extras"),
        ]),

        // A peripheral in its own process, for the cross-process radio tests.
        .executableTarget(name: "SimRadioPeer", dependencies: ["BoxkeyRadio", "BoxkeySimRadio"]),

        .testTarget(
            name: "BoxkeyRadioTests",
            dependencies: ["BoxkeyRadio", "BoxkeySimRadio", "SimRadioPeer"]
        ),
        .testTarget(
            name: "BoxkeyCoreTests",
            dependencies: ["BoxkeyCore"],
            exclude: ["Interop"]
        ),
    ]
)
