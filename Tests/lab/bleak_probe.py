"""An independent BLE central (bleak) against a Boxkey box: scan until the box's advertisement
is heard, connect, read the service, subscribe, write one garbage frame, wait for the box's
answer (a notification), disconnect. Prints one JSON line with what it saw and the time from
the start of the scan to the notification."""
import asyncio
import json
import sys
import time

from bleak import BleakClient, BleakScanner

SERVICE = "ea000001-caf9-4a51-a017-a07d06dfeed4"
INFO = "ea000002-caf9-4a51-a017-a07d06dfeed4"
REQUEST = "ea000003-caf9-4a51-a017-a07d06dfeed4"
RESPONSE = "ea000004-caf9-4a51-a017-a07d06dfeed4"
CHANNEL = bytes.fromhex("b00b1e55")  # the probe's frame channel (docs/protocol.md, section 4)
COMPANY = 0xFFFF


async def main(adapter, box_id):
    start = time.monotonic()
    found = asyncio.Event()
    seen = {}

    def heard(device, adv):
        payload = adv.manufacturer_data.get(COMPANY)
        if SERVICE in [u.lower() for u in adv.service_uuids] and payload and len(payload) == 6:
            # Advertisement: version, flags, box ID (2 bytes BCD-free big-endian), nonce.
            seen.update(address=device.address, payload=payload.hex())
            found.set()

    async with BleakScanner(heard, adapter=adapter, service_uuids=[SERVICE]):
        await asyncio.wait_for(found.wait(), 30)
    scanned = time.monotonic()
    notified = asyncio.Event()
    answers = []
    async with BleakClient(seen["address"], adapter=adapter, timeout=30) as client:
        connected = time.monotonic()
        services = [s.uuid for s in client.services]
        info = await client.read_gatt_char(INFO)

        def on_notify(_, data):
            answers.append(bytes(data).hex())
            notified.set()

        await client.start_notify(RESPONSE, on_notify)
        # A whole protocol-3 frame (channel, index 0, length 5) holding an envelope of a version
        # no box speaks: the box answers on this channel with a refusal and hangs up.
        await client.write_gatt_char(REQUEST, CHANNEL + bytes([0x00, 0x00, 0x05, 0xEE]) + b"junk", response=True)
        await asyncio.wait_for(notified.wait(), 20)
        done = time.monotonic()
    print(json.dumps({
        "address": seen["address"], "advertisement": seen["payload"], "service_found": SERVICE in services,
        "info_bytes": len(info), "answers": answers,
        "scan_ms": round((scanned - start) * 1000), "connect_ms": round((connected - scanned) * 1000),
        "exchange_ms": round((done - connected) * 1000), "total_ms": round((done - start) * 1000),
    }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
