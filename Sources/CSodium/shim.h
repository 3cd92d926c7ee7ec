#ifndef BOXKEY_CSODIUM_SHIM_H
#define BOXKEY_CSODIUM_SHIM_H
#include <sodium.h>
#endif
