#ifndef BOXKEY_CDBUS_SHIM_H
#define BOXKEY_CDBUS_SHIM_H
#include <dbus/dbus.h>
#endif
