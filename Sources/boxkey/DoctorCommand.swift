import ArgumentParser
import BoxkeyHost
import BoxkeyPhone
import FoundationEssentials

extension Boxkey {
    struct Doctor: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check what stops this device logging in (the radio: bluetoothd, the adapter, rfkill; this phone's files, key, boxes and vault; the agent) and say what to do.",
            discussion: "Each line is ok, warning or FAILED. Exit status 0 when nothing failed, 1 otherwise.")
        @OptionGroup var radio: RadioOptions
        @Flag(help: "As a JSON object.") var json = false

        func run() async throws {
            let report = await PhoneDoctor.run(radio: radio.radio, adapter: radio.adapter)
            print(report.output(json: json))
            if report.failed { throw ExitCode(1) }
        }
    }
}
