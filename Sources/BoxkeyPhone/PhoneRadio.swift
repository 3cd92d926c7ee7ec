import BoxkeyRadio

/// The radio this phone uses, as the phone's flows need it. Which one (BlueZ on a real adapter,
/// or the simulated air shared with a box on this machine) is chosen and opened by the program
/// (BoxkeyTransports' `PhoneRadios.open`): this library never names a transport.
public protocol PhoneRadio: AnyObject, Sendable {
    var central: any CentralRadio { get }
    /// A central for finding the box again after a link loss (the simulated radio gives one at
    /// the phone's position now, which may have changed since it opened).
    func centralForReattach() -> any CentralRadio
    /// Whether `followMoves` can move this phone (the simulated radio's walks).
    var canWalk: Bool { get }
    /// Moves the phone as `boxkey sim move` asked, if it asked since the last call: only the
    /// simulated radio can walk; the presence link, or the agent while it holds none, calls this
    /// as it runs.
    func followMoves(log: (String) -> Void)
    func shutdown()
}
