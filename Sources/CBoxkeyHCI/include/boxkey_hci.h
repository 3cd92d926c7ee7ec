#ifndef BOXKEY_HCI_H
#define BOXKEY_HCI_H
#include <stdint.h>

/// The RSSI of a connected LE link (HCI Read RSSI), in dBm. BlueZ's D-Bus API has no
/// connected-link RSSI, so this goes to the controller through libbluetooth.
/// `adapter` is "hci0"; `address` is "AA:BB:CC:DD:EE:FF". Returns 0 or -errno.
int boxkey_hci_read_rssi(const char *adapter, const char *address, int8_t *rssi);

#endif
