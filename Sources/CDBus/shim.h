#ifndef BOXKEY_CDBUS_SHIM_H
#define BOXKEY_CDBUS_SHIM_H
#include <dbus/dbus.h>
#include <sys/eventfd.h> /* the D-Bus thread's wake-up */
#endif
