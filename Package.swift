// swift-tools-version: 6.1
import PackageDescription

// Layers, bottom to top (nothing points back up):
//   C libraries (system-library targets)  ->  BoxkeyCore (pure: crypto, Noise, wire format, state machines)
//   -> BoxkeyRadio (the radio interface) and its transports (BoxkeyBlueZ, BoxkeySimRadio)
//   -> BoxkeyDaemon (the box) and BoxkeyPhone (the phone), which know the radio by its interface
//   -> BoxkeyTransports (which transport, opened at the edge)  ->  executables.
// The PAM module (pam_boxkey, C) stands apart: it shares only the wire format, checked by tests.
// BoxkeyTestWorlds (Tests/Worlds) is what the tests start around the code (a private D-Bus,
// bluezoo, child processes); no product contains it.
// Hooks only the tests use (the vault's test clock) exist in debug builds only: what
// packages ship is a release build, which does not have them.
let testHooks: [SwiftSetting] = [.define("BOXKEY_TEST_HOOKS", .when(configuration: .debug))]

let package = Package(
    name: "Boxkey",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "BoxkeyCore", targets: ["BoxkeyCore"]),
        .library(name: "BoxkeyRadio", targets: ["BoxkeyRadio", "BoxkeySimRadio"]),
        .library(name: "BoxkeyPAMWire", targets: ["BoxkeyPAMWire"]),
        .library(name: "BoxkeyDaemon", targets: ["BoxkeyDaemon"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", exact: "2.101.3"),
        .package(url: "https://github.com/apple/swift-argument-parser", exact: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", exact: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", exact: "2.13.0"),
    ],
    targets: [
        // C libraries from Debian, wrapped as system-library targets.
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),
        .systemLibrary(
            name: "CPAM",
            pkgConfig: "pam",
            providers: [.apt(["libpam0g-dev"])]
        ),
        // libsystemd: the journal (sd_journal_sendv: priorities and fields) and sd_notify, for boxkeyd.
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        .systemLibrary(
            name: "CDBus",
            pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev"])]
        ),

        // Linux calls that need _GNU_SOURCE (SO_PEERCRED, PR_SET_DUMPABLE, posix_spawn's GNU extensions).
        .target(name: "CBoxkeySys"),

        // gettext for what the CLI and the PAM module say (po/, Russian first). Glibc only.
        .target(name: "BoxkeyL10n", dependencies: ["CBoxkeySys"]),

        // A small D-Bus layer over libdbus-1: calls, signals, exported objects, fd passing.
        .target(name: "BoxkeyDBus", dependencies: ["CDBus", .product(name: "NIOConcurrencyHelpers", package: "swift-nio")]),

        // libldap (OpenLDAP's client), for the fleet directory: connect with TLS, bind, paged
        // search, change one value. Its synchronous API, wrapped in C (LDAPMod's unions), and
        // loaded with dlopen only when a box has [fleet] (it brings GnuTLS: ~3 MiB of RSS).
        .target(name: "CBoxkeyLDAP", linkerSettings: [.linkedLibrary("dl")]),

        // libbluetooth, for what BlueZ's D-Bus API lacks (connected-link RSSI).
        .target(name: "CBoxkeyHCI", linkerSettings: [.linkedLibrary("bluetooth")]),

        // The radio interface over BlueZ's D-Bus API.
        .target(name: "BoxkeyBlueZ", dependencies: [
            "BoxkeyDBus", "BoxkeyRadio", "CBoxkeyHCI",
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ]),

        // The pure core: no sockets, no D-Bus, no clocks of its own (time is passed in).
        .target(
            name: "BoxkeyCore",
            dependencies: ["CSodium"]
        ),

        // What the box and the phone both need from this host: private files written
        // durably, the console, the doctor's checks, and the name of the radio to use.
        .target(name: "BoxkeyHost", dependencies: ["BoxkeyDBus", "CBoxkeySys", .product(name: "NIOCore", package: "swift-nio")]),

        // The radio interface both transports implement (BlueZ, simulated).
        .target(name: "BoxkeyRadio", dependencies: [.product(name: "NIOConcurrencyHelpers", package: "swift-nio")]),

        // The simulated radio: in-process and between processes on one machine.
        .target(name: "BoxkeySimRadio", dependencies: [
            "BoxkeyRadio",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ]),

        // The daemon <-> PAM module socket protocol (the daemon's side) and the blocking client
        // boxkeyd's admin commands use.
        .target(name: "BoxkeyPAMWire"),

        // The PAM module, in C over libpam and libc (docs/architecture.md says why): built here
        // so the tests can check its wire code against BoxkeyPAMWire; scripts/build-pam-module
        // links the installable pam_boxkey.so from the same files.
        .target(name: "pam_boxkey", linkerSettings: [.linkedLibrary("pam")]),

        // The box daemon's parts, as a library so tests can run them in-process.
        .target(name: "BoxkeyDaemon", dependencies: [
            "BoxkeyCore", "BoxkeyHost", "BoxkeyRadio", "BoxkeyDBus", "BoxkeyPAMWire", "CDBus", "CBoxkeySys", "CBoxkeyLDAP", "CPAM", "CSystemd",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ]),
        .executableTarget(name: "boxkeyd", dependencies: [
            "BoxkeyCore", "BoxkeyDaemon", "BoxkeyHost", "BoxkeyPAMWire", "BoxkeyTransports",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
        ]),

        // The phone's behaviour: identity, pinned boxes, the vault, finding a box, the link to
        // it, the presence link, the agent. The `boxkey` CLI only parses and prints.
        .target(name: "BoxkeyPhone", dependencies: [
            "BoxkeyCore", "BoxkeyHost", "BoxkeyRadio", "BoxkeyDBus", "CBoxkeySys", "BoxkeyL10n",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], swiftSettings: testHooks),

        // The transports, chosen at the edge: opens BlueZ or the simulated radio for the box
        // (`BoxRadios`) and the phone (`PhoneRadios`). Only the two programs depend on it (the
        // benchmarks and tests open the transports they test themselves); BoxkeyDaemon and BoxkeyPhone know the radio by its interface only.
        .target(name: "BoxkeyTransports", dependencies: [
            "BoxkeyCore", "BoxkeyHost", "BoxkeyRadio", "BoxkeySimRadio", "BoxkeyBlueZ", "BoxkeyDaemon", "BoxkeyPhone",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ]),
        .executableTarget(name: "boxkey", dependencies: [
            "BoxkeyL10n",
            "BoxkeyCore", "BoxkeyHost", "BoxkeyPhone", "BoxkeyRadio", "BoxkeyTransports", "CBoxkeySys",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ], swiftSettings: testHooks),

        // The benchmarks: scripts/bench [--short] (release build).
        .executableTarget(name: "boxkey-bench", dependencies: [
            "BoxkeyCore", "BoxkeyDaemon", "BoxkeyPhone", "BoxkeyRadio", "BoxkeySimRadio", "BoxkeyPAMWire",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], path: "Benchmarks/BoxkeyBench"),

        // A peripheral in its own process, for the cross-process radio tests.
        .executableTarget(name: "SimRadioPeer", dependencies: ["BoxkeyRadio", "BoxkeySimRadio"]),

        // What tests start around the code under test (a private D-Bus, bluezoo, child
        // processes): a library of the test targets only, in no product.
        .target(name: "BoxkeyTestWorlds", dependencies: ["BoxkeyDBus", "BoxkeyRadio", "CBoxkeySys"], path: "Tests/Worlds"),
        .testTarget(
            name: "BoxkeyRadioTests",
            dependencies: ["BoxkeyHost", "BoxkeyRadio", "BoxkeySimRadio", "SimRadioPeer", "BoxkeyBlueZ", "BoxkeyDBus", "CDBus", "CBoxkeySys", "BoxkeyTestWorlds"]
        ),
        .testTarget(
            name: "BoxkeyDaemonTests",
            dependencies: ["BoxkeyDaemon", "BoxkeyPhone", "BoxkeyCore", "BoxkeyHost", "BoxkeyRadio", "BoxkeySimRadio", "BoxkeyPAMWire", "pam_boxkey", "CBoxkeySys",
                           "BoxkeyBlueZ", "BoxkeyTestWorlds",
                           .product(name: "Logging", package: "swift-log"),
                           .product(name: "NIOConcurrencyHelpers", package: "swift-nio")]
        ),
        .testTarget(
            name: "BoxkeyPhoneTests",
            dependencies: ["BoxkeyPhone", "BoxkeyCore", "BoxkeyRadio", "BoxkeySimRadio"]
        ),
        .testTarget(
            name: "BoxkeyCoreTests",
            dependencies: ["BoxkeyCore"],
            exclude: ["Interop"]
        ),
    ]
)
