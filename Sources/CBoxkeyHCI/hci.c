#include "boxkey_hci.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <bluetooth/bluetooth.h>
#include <bluetooth/hci.h>
#include <bluetooth/hci_lib.h>

/* The kernel's link type for LE connections (include/net/bluetooth/hci.h); libbluetooth's
 * headers stop at ESCO_LINK. */
#ifndef LE_LINK
#define LE_LINK 0x80
#endif

int boxkey_hci_read_rssi(const char *adapter, const char *address, int8_t *rssi) {
    int dev_id = hci_devid(adapter);
    if (dev_id < 0) return -ENODEV;
    bdaddr_t peer;
    if (str2ba(address, &peer) < 0) return -EINVAL;
    int dd = hci_open_dev(dev_id);
    if (dd < 0) return -errno;
    struct hci_conn_info_req *request = calloc(1, sizeof(*request) + sizeof(struct hci_conn_info));
    if (!request) { close(dd); return -ENOMEM; }
    bacpy(&request->bdaddr, &peer);
    request->type = LE_LINK;
    int result = 0;
    if (ioctl(dd, HCIGETCONNINFO, (unsigned long)request) < 0) {
        result = -errno;
    } else if (hci_read_rssi(dd, htobs(request->conn_info->handle), rssi, 1000) < 0) {
        result = errno ? -errno : -EIO;
    }
    free(request);
    close(dd);
    return result;
}
