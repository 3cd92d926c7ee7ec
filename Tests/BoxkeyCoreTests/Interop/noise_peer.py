"""An independent Noise peer for Boxkey's interop tests, built on the PyPI package
`noiseprotocol` (not on libsodium), driven over stdin/stdout one hex line at a time.

Modes:
  vectors  <json>      compute msg1, msg2 and two transport messages with fixed keys for both
                       roles and print them as JSON (byte-for-byte comparison with Swift).
  initiator <json>     act as the phone: print msg1, read msg2, print an encrypted payload,
                       read an encrypted reply and print its plaintext.
  responder <json>     act as the box: read msg1, print msg2, read an encrypted payload and
                       print its plaintext, then print an encrypted reply.
"""
import json
import sys

from noise.connection import NoiseConnection, Keypair

NAME = b"Noise_IK_25519_ChaChaPoly_BLAKE2b"


PSK_NAME = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2b"


def conn(role, cfg, static_priv, ephemeral_priv=None, remote_pub=None):
    # With "psk" in the config: IKpsk2, Boxkey's pairing handshake.
    c = NoiseConnection.from_name(PSK_NAME if "psk" in cfg else NAME)
    if "psk" in cfg:
        c.set_psks(psk=bytes.fromhex(cfg["psk"]))
    if role == "initiator":
        c.set_as_initiator()
    else:
        c.set_as_responder()
    c.set_prologue(bytes.fromhex(cfg["prologue"]))
    c.set_keypair_from_private_bytes(Keypair.STATIC, bytes.fromhex(static_priv))
    if ephemeral_priv:
        c.set_keypair_from_private_bytes(Keypair.EPHEMERAL, bytes.fromhex(ephemeral_priv))
    if remote_pub:
        c.set_keypair_from_public_bytes(Keypair.REMOTE_STATIC, bytes.fromhex(remote_pub))
    c.start_handshake()
    return c


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def read_hex():
    return bytes.fromhex(sys.stdin.readline().strip())


def main():
    mode, cfg = sys.argv[1], json.loads(sys.argv[2])
    if mode == "vectors":
        i = conn("initiator", cfg, cfg["phone_static"], cfg["phone_ephemeral"], cfg["box_public"])
        r = conn("responder", cfg, cfg["box_static"], cfg["box_ephemeral"])
        m1 = i.write_message()
        r.read_message(m1)
        m2 = r.write_message()
        i.read_message(m2)
        t1 = i.encrypt(bytes.fromhex(cfg["phone_payload"]))
        assert r.decrypt(t1) == bytes.fromhex(cfg["phone_payload"])
        t2 = r.encrypt(bytes.fromhex(cfg["box_payload"]))
        assert i.decrypt(t2) == bytes.fromhex(cfg["box_payload"])
        out(json.dumps({"m1": m1.hex(), "m2": m2.hex(), "t1": t1.hex(), "t2": t2.hex(),
                        "hash": i.get_handshake_hash().hex()}))
    elif mode == "initiator":
        i = conn("initiator", cfg, cfg["phone_static"], remote_pub=cfg["box_public"])
        out(i.write_message().hex())
        i.read_message(read_hex())
        out(i.encrypt(bytes.fromhex(cfg["phone_payload"])).hex())
        out(i.decrypt(read_hex()).hex())
    elif mode == "responder":
        r = conn("responder", cfg, cfg["box_static"])
        r.read_message(read_hex())
        out(r.write_message().hex())
        out(r.decrypt(read_hex()).hex())
        out(r.encrypt(bytes.fromhex(cfg["box_payload"])).hex())
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
