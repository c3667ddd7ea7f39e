/* Lets Debian 12's simple-whip-client run: preloaded with LD_PRELOAD into that process only.
 *
 * Debian 12 builds simple-whip-client (0.0~git20230131) against libsoup 2.4, and its libnice
 * (0.1.21, through gupnp-igd 1.6) against libsoup 3.0. When webrtcbin loads libnice, libsoup 3's
 * constructor looks for libsoup 2's `soup_uri_new` in the process and aborts it ("libsoup2
 * symbols detected"), before a single packet is sent. The client itself only uses libsoup 2 for
 * its HTTP requests, and libnice's libsoup 3 is only used for UPnP port mapping, which a WHIP
 * publish on a LAN does not need; so the probe is answered "not found" and both load. Upstream
 * has since moved the client to libsoup 3, which needs none of this.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

typedef int gboolean;
typedef void *gpointer;

gboolean g_module_symbol(void *module, const char *name, gpointer *symbol) {
    static gboolean (*real)(void *, const char *, gpointer *) = 0;
    if (name != 0 && strcmp(name, "soup_uri_new") == 0) {
        if (symbol != 0)
            *symbol = 0;
        return 0;
    }
    if (real == 0)
        real = (gboolean (*)(void *, const char *, gpointer *))dlsym(RTLD_NEXT, "g_module_symbol");
    return real(module, name, symbol);
}
