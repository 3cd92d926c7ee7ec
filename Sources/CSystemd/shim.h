#ifndef BOXKEY_CSYSTEMD_SHIM_H
#define BOXKEY_CSYSTEMD_SHIM_H
#include <systemd/sd-journal.h>
#include <systemd/sd-daemon.h>
#endif
