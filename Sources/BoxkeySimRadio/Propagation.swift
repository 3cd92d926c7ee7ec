import FoundationEssentials
import Glibc

/// A device's position on a line, in metres, as a function of time: still, or moving at a
/// constant speed from one point to another.
public struct Trajectory: Sendable, Hashable, Codable {
    public var from: Double
    public var to: Double
    public var start: Duration
    public var duration: Duration

    public static func still(at position: Double) -> Trajectory {
        Trajectory(from: position, to: position, start: .zero, duration: .zero)
    }

    public func position(at t: Duration) -> Double {
        if t >= start + duration { return to }
        if t <= start { return from }
        let f = (t - start) / duration
        return from + (to - from) * f
    }

    /// The first time at or after `t` when the distance to a still point `other` exceeds
    /// `range`, if that ever happens on this trajectory.
    public func exitTime(from other: Double, range: Double, after t: Duration) -> Duration? {
        let distance = { (p: Double) in abs(p - other) }
        if distance(position(at: t)) > range { return t }
        if distance(to) <= range || duration <= .zero { return nil }
        // Linear motion: solve |from + (to-from)f - other| = range for the crossing f in [0,1].
        let direction: Double = to > from ? 1 : -1
        let boundary = other + direction * range
        let f = (boundary - from) / (to - from)
        let crossing = start + duration * max(0, min(1, f))
        return max(t, crossing) + .nanoseconds(1)
    }
}

/// Received signal strength from distance: log-distance path loss with Gaussian noise.
public struct PathLoss: Sendable {
    public let parameters: SimulationParameters

    public init(_ parameters: SimulationParameters) { self.parameters = parameters }

    public func meanRSSI(distance: Double) -> Double {
        parameters.rssiAtOneMetre - 10 * parameters.pathLossExponent * log10(max(distance, 0.1))
    }

    public func rssi<G: RandomNumberGenerator>(distance: Double, using rng: inout G) -> Int {
        // Box-Muller for a normal sample.
        let u1 = Double.random(in: Double.ulpOfOne..<1, using: &rng)
        let u2 = Double.random(in: 0..<1, using: &rng)
        let z = (-2 * log(u1)).squareRoot() * cos(2 * .pi * u2)
        return Int((meanRSSI(distance: distance) + z * parameters.rssiNoise).rounded())
    }

    public func inRange(distance: Double) -> Bool { distance <= parameters.range }
}

/// SplitMix64: a small seeded generator, so noise and delays repeat run to run.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E3779B97F4A7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) &* 0x94D049BB133111EB
        return z ^ (z >> 31)
    }
}
