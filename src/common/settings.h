/* settings.h — the one table of TANDEM_* switches: name, default, meaning. Values come from the
 * environment (or scripts/serve.env through the environment); tdm_setting() reads one. */
#ifndef TDM_SETTINGS_H
#define TDM_SETTINGS_H
#include <stdio.h>
#ifdef __cplusplus
extern "C" {
#endif

struct tdm_setting_def {
    const char *name;     /* TANDEM_... */
    const char *def;      /* default value */
    const char *allowed;  /* "a|b|c" for a choice, "int", "path" */
    const char *meaning;
};

extern const struct tdm_setting_def tdm_settings[];
extern const int tdm_nsettings;

/* The value in effect (environment, else default). Aborts on a name not in the table. */
const char *tdm_setting(const char *name);
/* Same, as an integer; an unparsable value is reported through tdm_err and returns -1. */
int tdm_setting_int(const char *name, long *out);
/* Validates every TANDEM_* variable in the environment against the table (unknown names,
 * values outside a choice). Returns 0 or -1 with tdm_err(). */
int tdm_settings_check(void);
/* Prints every switch: name, value in effect, where it came from, meaning. */
void tdm_settings_print(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
