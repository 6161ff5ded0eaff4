/* json_get FILE [PATH] — parses FILE with jansson (exit 1 with the parser's message if it is not
 * JSON) and prints the value at PATH (dot-separated object keys and array indices, e.g.
 * comparisons.0.agree) as compact JSON; without PATH prints nothing. Exit 1 when PATH is absent.
 * Lets the shell tests read JSON records without jq or python. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: json_get FILE [PATH]\n");
        return 2;
    }
    json_error_t e;
    json_t *root = json_load_file(argv[1], 0, &e);
    if (!root) {
        fprintf(stderr, "json_get: %s: line %d: %s\n", argv[1], e.line, e.text);
        return 1;
    }
    json_t *v = root;
    if (argc == 3) {
        char *path = strdup(argv[2]), *save = NULL;
        for (char *k = strtok_r(path, ".", &save); k && v; k = strtok_r(NULL, ".", &save)) {
            if (json_is_array(v)) {
                char *end;
                long i = strtol(k, &end, 10);
                v = *end ? NULL : json_array_get(v, (size_t)i);
            } else {
                v = json_object_get(v, k);
            }
        }
        free(path);
        if (!v) {
            fprintf(stderr, "json_get: %s: no %s\n", argv[1], argv[2]);
            json_decref(root);
            return 1;
        }
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        printf("%s\n", s ? s : "");
        free(s);
    }
    json_decref(root);
    return 0;
}
