/* test_toml.c — the TOML parser against the examples of the TOML v1.0 specification (expected
 * values written from the spec text, not from the parser), its error messages with line and
 * column, and robustness on truncated and mutated input. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/toml.h"
#include "gt_test.h"

static gt_toml_value *parse(const char *text)
{
    gt_toml_value *root = NULL;
    gt_error err = {0};
    gt_status st = gt_toml_parse(text, strlen(text), "t.toml", &root, &err);
    EXPECT(st == GT_OK, "parse failed: %s\n--- input ---\n%s", err.msg, text);
    return root;
}

/* Follows a path of keys separated by '/' (keys here never contain '/'). */
static const gt_toml_value *get(const gt_toml_value *v, const char *path)
{
    char part[128];
    while (v && *path) {
        const char *slash = strchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : strlen(path);
        memcpy(part, path, n);
        part[n] = '\0';
        const gt_toml_entry *e = gt_toml_find(v, part, n);
        v = e ? e->value : NULL;
        path += n + (slash ? 1 : 0);
    }
    return v;
}

static void expect_str(const gt_toml_value *root, const char *path, const char *want)
{
    const gt_toml_value *v = get(root, path);
    EXPECT(v && v->type == GT_TOML_STRING && v->as.str.len == strlen(want) &&
               !memcmp(v->as.str.data, want, strlen(want)),
           "%s: want string [%s], got [%s]", path, want,
           v && v->type == GT_TOML_STRING ? v->as.str.data : "(not a string)");
}

static void expect_int(const gt_toml_value *root, const char *path, int64_t want)
{
    const gt_toml_value *v = get(root, path);
    EXPECT(v && v->type == GT_TOML_INTEGER && v->as.integer == want, "%s: want %lld, got %lld",
           path, (long long)want, v && v->type == GT_TOML_INTEGER ? (long long)v->as.integer : -1);
}

static void expect_float(const gt_toml_value *root, const char *path, double want)
{
    const gt_toml_value *v = get(root, path);
    bool ok = v && v->type == GT_TOML_FLOAT &&
              (isnan(want) ? isnan(v->as.number) : memcmp(&v->as.number, &want, 8) == 0);
    EXPECT(ok, "%s: want %.17g, got %.17g", path, want,
           v && v->type == GT_TOML_FLOAT ? v->as.number : -1.0);
}

static void expect_bool(const gt_toml_value *root, const char *path, bool want)
{
    const gt_toml_value *v = get(root, path);
    EXPECT(v && v->type == GT_TOML_BOOLEAN && v->as.boolean == want, "%s: want %d", path, want);
}

static void test_comments_keys(void)
{
    gt_toml_value *r = parse("# This is a full-line comment\n"
                             "key = \"value\"  # This is a comment at the end of a line\n"
                             "another = \"# This is not a comment\"\n"
                             "bare_key = \"value\"\n"
                             "bare-key = \"value\"\n"
                             "1234 = \"value\"\n"
                             "\"127.0.0.1\" = \"value\"\n"
                             "\"character encoding\" = \"value\"\n"
                             "\"\xca\x8e\xc7\x9d\xca\x9e\" = \"value\"\n"
                             "'key2' = \"value\"\n"
                             "'quoted \"value\"' = \"value\"\n"
                             "\"\" = \"blank\"\n"
                             "name = \"Orange\"\n"
                             "physical.color = \"orange\"\n"
                             "physical.shape = \"round\"\n"
                             "site.\"google.com\" = true\n"
                             "fruit.name = \"banana\"\n"
                             "fruit. color = \"yellow\"\n"
                             "fruit . flavor = \"banana\"\n"
                             "3.14159 = \"pi\"\n");
    expect_str(r, "key", "value");
    expect_str(r, "another", "# This is not a comment");
    expect_str(r, "bare-key", "value");
    expect_str(r, "1234", "value");
    expect_str(r, "127.0.0.1", "value");
    expect_str(r, "character encoding", "value");
    expect_str(r, "\xca\x8e\xc7\x9d\xca\x9e", "value");
    expect_str(r, "key2", "value");
    expect_str(r, "quoted \"value\"", "value");
    const gt_toml_entry *blank = gt_toml_find(r, "", 0);
    EXPECT(blank && blank->value->type == GT_TOML_STRING &&
               !strcmp(blank->value->as.str.data, "blank"),
           "empty quoted key");
    expect_str(r, "physical/color", "orange");
    expect_str(r, "physical/shape", "round");
    expect_bool(r, "site/google.com", true);
    expect_str(r, "fruit/name", "banana");
    expect_str(r, "fruit/color", "yellow");
    expect_str(r, "fruit/flavor", "banana");
    expect_str(r, "3/14159", "pi"); /* a dotted key, per the spec */
    /* Entries keep document order and the position of their key. */
    EXPECT(r && r->as.table.n == 16, "16 top-level keys, got %d", r ? r->as.table.n : -1);
    const gt_toml_entry *e = gt_toml_find(r, "another", 7);
    EXPECT(e && e->line == 3 && e->col == 1, "position of 'another': %d:%d", e ? e->line : 0,
           e ? e->col : 0);
    gt_toml_free(r);
}

static void test_strings(void)
{
    gt_toml_value *r = parse(
        "str = \"I'm a string. \\\"You can quote me\\\". Name\\tJos\\u00E9\\nLocation\\tSF.\"\n"
        "str1 = \"\"\"\nRoses are red\nViolets are blue\"\"\"\n"
        "str2 = \"\"\"\nThe quick brown \\\n\n\n  fox jumps over \\\n    the lazy dog.\"\"\"\n"
        "str3 = \"\"\"\\\n       The quick brown \\\n       fox jumps over \\\n       the lazy "
        "dog.\\\n       \"\"\"\n"
        "str4 = \"\"\"Here are two quotation marks: \"\". Simple enough.\"\"\"\n"
        "str5 = \"\"\"Here are three quotation marks: \"\"\\\".\"\"\"\n"
        "str6 = \"\"\"Here are fifteen quotation marks: "
        "\"\"\\\"\"\"\\\"\"\"\\\"\"\"\\\"\"\"\\\".\"\"\"\n"
        "str7 = \"\"\"\"This,\" she said, \"is just a pointless statement.\"\"\"\"\n"
        "winpath  = 'C:\\Users\\nodejs\\templates'\n"
        "winpath2 = '\\\\ServerX\\admin$\\system32\\'\n"
        "quoted   = 'Tom \"Dubs\" Preston-Werner'\n"
        "regex    = '<\\i\\c*\\s*>'\n"
        "regex2 = '''I [dw]on't need \\d{2} apples'''\n"
        "lines  = '''\nThe first newline is\ntrimmed in raw strings.\n   All other whitespace\n"
        "   is preserved.\n'''\n"
        "quot15 = '''Here are fifteen quotation marks: \"\"\"\"\"\"\"\"\"\"\"\"\"\"\"'''\n"
        "apos15 = \"Here are fifteen apostrophes: '''''''''''''''\"\n"
        "str8 = ''''That,' she said, 'is still pointless.''''\n"
        "escapes = \"\\b\\t\\n\\f\\r\\\"\\\\\\U0001F600\\u0000end\"\n"
        "crlf = \"\"\"a\r\nb\"\"\"\n"
        "empty = \"\"\nempty_lit = ''\nempty_multi = \"\"\"\"\"\"\n");
    expect_str(r, "str", "I'm a string. \"You can quote me\". Name\tJos\xc3\xa9\nLocation\tSF.");
    expect_str(r, "str1", "Roses are red\nViolets are blue");
    expect_str(r, "str2", "The quick brown fox jumps over the lazy dog.");
    expect_str(r, "str3", "The quick brown fox jumps over the lazy dog.");
    expect_str(r, "str4", "Here are two quotation marks: \"\". Simple enough.");
    expect_str(r, "str5", "Here are three quotation marks: \"\"\".");
    expect_str(r, "str6", "Here are fifteen quotation marks: \"\"\"\"\"\"\"\"\"\"\"\"\"\"\".");
    expect_str(r, "str7", "\"This,\" she said, \"is just a pointless statement.\"");
    expect_str(r, "winpath", "C:\\Users\\nodejs\\templates");
    expect_str(r, "winpath2", "\\\\ServerX\\admin$\\system32\\");
    expect_str(r, "quoted", "Tom \"Dubs\" Preston-Werner");
    expect_str(r, "regex", "<\\i\\c*\\s*>");
    expect_str(r, "regex2", "I [dw]on't need \\d{2} apples");
    expect_str(r, "lines",
               "The first newline is\ntrimmed in raw strings.\n   All other whitespace\n   is "
               "preserved.\n");
    expect_str(r, "quot15", "Here are fifteen quotation marks: \"\"\"\"\"\"\"\"\"\"\"\"\"\"\"");
    expect_str(r, "apos15", "Here are fifteen apostrophes: '''''''''''''''");
    expect_str(r, "str8", "'That,' she said, 'is still pointless.'");
    const gt_toml_value *esc = get(r, "escapes");
    static const char want[] = "\b\t\n\f\r\"\\\xf0\x9f\x98\x80\0end"; /* U+1F600, then NUL */
    EXPECT(esc && esc->as.str.len == sizeof want - 1 &&
               !memcmp(esc->as.str.data, want, sizeof want - 1),
           "escapes incl. \\U and \\u0000");
    expect_str(r, "crlf", "a\nb");
    expect_str(r, "empty", "");
    expect_str(r, "empty_lit", "");
    expect_str(r, "empty_multi", "");
    gt_toml_free(r);
}

static void test_numbers_booleans(void)
{
    gt_toml_value *r =
        parse("int1 = +99\nint2 = 42\nint3 = 0\nint4 = -17\n"
              "int5 = 1_000\nint6 = 5_349_221\nint7 = 53_49_221\nint8 = 1_2_3_4_5\n"
              "hex1 = 0xDEADBEEF\nhex2 = 0xdeadbeef\nhex3 = 0xdead_beef\n"
              "oct1 = 0o01234567\noct2 = 0o755\nbin1 = 0b11010110\n"
              "max = 9223372036854775807\nmin = -9223372036854775808\n"
              "hexmax = 0x7FFFFFFFFFFFFFFF\nzero_neg = -0\n"
              "flt1 = +1.0\nflt2 = 3.1415\nflt3 = -0.01\n"
              "flt4 = 5e+22\nflt5 = 1e06\nflt6 = -2E-2\nflt7 = 6.626e-34\n"
              "flt8 = 224_617.445_991_228\nflt9 = -0.0\nflt10 = +0.0\n"
              "sf1 = inf\nsf2 = +inf\nsf3 = -inf\nsf4 = nan\nsf5 = +nan\nsf6 = -nan\n"
              "big = 1.7976931348623157e308\ntiny = 4.9e-324\nunder = 1e-400\n"
              "bool1 = true\nbool2 = false\n");
    expect_int(r, "int1", 99);
    expect_int(r, "int2", 42);
    expect_int(r, "int3", 0);
    expect_int(r, "int4", -17);
    expect_int(r, "int5", 1000);
    expect_int(r, "int6", 5349221);
    expect_int(r, "int7", 5349221);
    expect_int(r, "int8", 12345);
    expect_int(r, "hex1", 3735928559);
    expect_int(r, "hex2", 3735928559);
    expect_int(r, "hex3", 3735928559);
    expect_int(r, "oct1", 342391);
    expect_int(r, "oct2", 493);
    expect_int(r, "bin1", 214);
    expect_int(r, "max", INT64_MAX);
    expect_int(r, "min", INT64_MIN);
    expect_int(r, "hexmax", INT64_MAX);
    expect_int(r, "zero_neg", 0);
    expect_float(r, "flt1", 1.0);
    expect_float(r, "flt2", 3.1415);
    expect_float(r, "flt3", -0.01);
    expect_float(r, "flt4", 5e22);
    expect_float(r, "flt5", 1e6);
    expect_float(r, "flt6", -0.02);
    expect_float(r, "flt7", 6.626e-34);
    expect_float(r, "flt8", 224617.445991228);
    expect_float(r, "flt9", -0.0);
    expect_float(r, "flt10", 0.0);
    expect_float(r, "sf1", INFINITY);
    expect_float(r, "sf2", INFINITY);
    expect_float(r, "sf3", -INFINITY);
    expect_float(r, "sf4", NAN);
    expect_float(r, "sf5", NAN);
    expect_float(r, "sf6", NAN);
    expect_float(r, "big", 1.7976931348623157e308);
    expect_float(r, "tiny", 4.9e-324);
    expect_float(r, "under", 0.0);
    expect_bool(r, "bool1", true);
    expect_bool(r, "bool2", false);
    gt_toml_free(r);
}

static void test_arrays_tables(void)
{
    gt_toml_value *r =
        parse("integers = [ 1, 2, 3 ]\n"
              "colors = [ \"red\", \"yellow\", \"green\" ]\n"
              "nested_arrays_of_ints = [ [ 1, 2 ], [3, 4, 5] ]\n"
              "nested_mixed_array = [ [ 1, 2 ], [\"a\", \"b\", \"c\"] ]\n"
              "string_array = [ \"all\", 'strings', \"\"\"are the same\"\"\", '''type''' ]\n"
              "numbers = [ 0.1, 0.2, 0.5, 1, 2, 5 ]\n"
              "contributors = [\n  \"Foo Bar <foo@example.com>\",\n  { name = \"Baz Qux\", email = "
              "\"bazqux@example.com\", url = \"https://example.com/bazqux\" }\n]\n"
              "integers2 = [\n  1, 2, 3\n]\n"
              "integers3 = [\n  1,\n  2, # this is ok\n]\n"
              "empty = [ ]\n"
              "name = { first = \"Tom\", last = \"Preston-Werner\" }\n"
              "point = { x = 1, y = 2 }\n"
              "animal = { type.name = \"pug\" }\n"
              "empty_inline = {}\n"
              "[table-1]\nkey1 = \"some string\"\nkey2 = 123\n"
              "[dog.\"tater.man\"]\ntype.name = \"pug\"\n"
              "[a.b.c]\n[ d.e.f ]\n[ g .  h  . i ]\n[ j . \"\xca\x9e\" . 'l' ]\n"
              "[x.y.z.w]\n[x]\nkx = 1\n"
              "[fruit]\napple.color = \"red\"\napple.taste.sweet = true\n"
              "[fruit.apple.texture]\nsmooth = true\n");
    const gt_toml_value *a = get(r, "integers");
    EXPECT(a && a->type == GT_TOML_ARRAY && a->as.array.n == 3 &&
               a->as.array.items[2]->as.integer == 3,
           "integers");
    a = get(r, "nested_arrays_of_ints");
    EXPECT(a && a->as.array.n == 2 && a->as.array.items[1]->type == GT_TOML_ARRAY &&
               a->as.array.items[1]->as.array.n == 3 &&
               a->as.array.items[1]->as.array.items[2]->as.integer == 5,
           "nested arrays");
    a = get(r, "nested_mixed_array");
    EXPECT(a && a->as.array.items[1]->as.array.items[0]->type == GT_TOML_STRING, "mixed array");
    a = get(r, "string_array");
    EXPECT(a && a->as.array.n == 4 && !strcmp(a->as.array.items[2]->as.str.data, "are the same"),
           "string array");
    a = get(r, "numbers");
    EXPECT(a && a->as.array.n == 6 && a->as.array.items[0]->type == GT_TOML_FLOAT &&
               a->as.array.items[3]->type == GT_TOML_INTEGER,
           "mixed number array");
    a = get(r, "contributors");
    EXPECT(a && a->as.array.n == 2 && a->as.array.items[1]->type == GT_TOML_TABLE, "contributors");
    if (a && a->as.array.n == 2) expect_str(a->as.array.items[1], "email", "bazqux@example.com");
    a = get(r, "integers2");
    EXPECT(a && a->as.array.n == 3, "multi-line array");
    a = get(r, "integers3");
    EXPECT(a && a->as.array.n == 2, "trailing comma and comment in array");
    a = get(r, "empty");
    EXPECT(a && a->type == GT_TOML_ARRAY && a->as.array.n == 0, "empty array");
    expect_str(r, "name/last", "Preston-Werner");
    expect_int(r, "point/y", 2);
    expect_str(r, "animal/type/name", "pug");
    a = get(r, "empty_inline");
    EXPECT(a && a->type == GT_TOML_TABLE && a->as.table.n == 0, "empty inline table");
    expect_str(r, "table-1/key1", "some string");
    expect_int(r, "table-1/key2", 123);
    expect_str(r, "dog/tater.man/type/name", "pug");
    EXPECT(get(r, "a/b/c") && get(r, "d/e/f") && get(r, "g/h/i") && get(r, "j/\xca\x9e/l"),
           "headers with spaces and quoted parts");
    expect_int(r, "x/kx", 1);
    EXPECT(get(r, "x/y/z/w") != NULL, "super table defined after its child");
    expect_str(r, "fruit/apple/color", "red");
    expect_bool(r, "fruit/apple/taste/sweet", true);
    expect_bool(r, "fruit/apple/texture/smooth", true);
    gt_toml_free(r);

    /* CRLF line endings and a byte-order mark. */
    r = parse("\xEF\xBB\xBF# c\r\n[s]\r\nk = 1 # x\r\nm = [\r\n 2,\r\n]\r\n");
    expect_int(r, "s/k", 1);
    EXPECT(get(r, "s/m") && get(r, "s/m")->as.array.n == 1, "CRLF array");
    gt_toml_free(r);

    /* Many keys in one table go through the hash index: all found, duplicates still caught. */
    char *big = malloc(2000 * 24);
    size_t o = 0;
    for (int i = 0; i < 2000; i++)
        o += (size_t)sprintf(big + o, "k%d = %d\n", i, i * 7);
    r = parse(big);
    int found = 0;
    for (int i = 0; i < 2000; i++) {
        char k[16];
        int n = sprintf(k, "k%d", i);
        const gt_toml_entry *e = gt_toml_find(r, k, (size_t)n);
        found += e && e->value->as.integer == i * 7 && e->line == i + 1;
    }
    EXPECT(found == 2000, "2000 keys found with values and lines (%d)", found);
    gt_toml_free(r);
    o += (size_t)sprintf(big + o, "k1234 = 0\n");
    gt_error err = {0};
    EXPECT(
        gt_toml_parse(big, o, "big.toml", &r, &err) == GT_ERR_INVALID &&
            strstr(err.msg, "big.toml:2001:1: duplicate key 'k1234' (first defined at line 1235)"),
        "duplicate in a large table: %s", err.msg);
    free(big);
}

typedef struct {
    const char *input;
    const char *message; /* the whole expected message after "t.toml:" */
} error_case;

static const error_case error_cases[] = {
    {"key = # INVALID\n", "1:7: expected a value (string, number, true/false, array or inline "
                          "table), found '#'"},
    {"first = \"Tom\" last = \"Preston-Werner\"\n",
     "1:15: expected a newline after a key/value pair, found 'l'"},
    {"= \"no key name\"\n", "1:1: expected a key (letters, digits, '_', '-' or a quoted string), "
                            "found '='"},
    {"a.b\n", "1:4: expected '=' after key, found end of line"},
    {"[training]\nsteps 5\n", "2:7: expected '=' after key, found '5'"},
    {"name = \"Tom\"\nname = \"Pradyun\"\n", "2:1: duplicate key 'name' (first defined at line 1)"},
    {"spelling = \"favorite\"\n\"spelling\" = \"favourite\"\n",
     "2:1: duplicate key 'spelling' (first defined at line 1)"},
    {"fruit.apple = 1\nfruit.apple.smooth = true\n",
     "2:7: cannot use 'apple' as a table: it is already an integer defined at line 1"},
    {"[fruit]\napple = \"red\"\n[fruit]\norange = \"orange\"\n",
     "3:1: table [fruit] is defined twice (first at line 1)"},
    {"[fruit]\napple = \"red\"\n[fruit.apple]\n",
     "3:8: cannot use 'apple' as a table: it is already a string defined at line 2"},
    {"[fruit]\napple.color = \"red\"\n[fruit.apple]\n",
     "3:1: table [apple] was already defined by dotted keys at line 2"},
    {"[product]\ntype = { name = \"Nail\" }\ntype.edible = false\n",
     "3:1: cannot add keys to 'type': it is an inline table defined at line 2"},
    {"[a.b.c]\nz = 9\n[a]\nb.c.t = 1\n",
     "4:3: cannot add to table [c] with a dotted key: it was defined by a [header] at line 1"},
    {"[a]\nb.c = 1\n[x]\n[a.b]\n", "4:1: table [b] was already defined by dotted keys at line 2"},
    {"a = {x = 1,}\n", "1:12: a trailing comma is not allowed in an inline table"},
    {"a = {x = 1\n}\n", "1:11: expected ',' or '}' in an inline table, found end of line (an "
                        "inline table must fit on one line)"},
    {"a = {x = 1, x = 2}\n", "1:13: duplicate key 'x' (first defined at line 1)"},
    {"a = \"\\q\"\n", "1:6: invalid escape sequence: backslash followed by 'q' (allowed: \\b \\t "
                      "\\n \\f \\r \\\" \\\\ \\uXXXX \\UXXXXXXXX)"},
    {"a = \"\\uD800\"\n", "1:6: invalid escape: U+D800 is not a Unicode scalar value"},
    {"a = \"\\u12\"\n", "1:6: invalid escape: \\u needs exactly 4 hexadecimal digits"},
    {"a = \"\\U00110000\"\n", "1:6: invalid escape: U+110000 is not a Unicode scalar value"},
    {"a = \"abc", "1:5: unterminated string (no closing \")"},
    {"a = \"abc\nb = 1\n", "1:5: unterminated string (a newline before the closing quote; use "
                           "triple quotes for a multi-line string)"},
    {"a = 'abc\n", "1:5: unterminated string (a newline before the closing quote; use triple "
                   "quotes for a multi-line string)"},
    {"a = \"\"\"abc\n\n", "1:5: unterminated string (no closing \"\"\")"},
    {"a = '''abc", "1:5: unterminated string (no closing ''')"},
    {"a = \"\"\"x\"\"\"\"\"\"\n", "1:9: too many quotes at the end of a multi-line string"},
    {"a = 9223372036854775808\n",
     "1:5: integer \"9223372036854775808\" does not fit in 64 bits (range -2^63 .. 2^63-1)"},
    {"a = -9223372036854775809\n",
     "1:5: integer \"-9223372036854775809\" does not fit in 64 bits (range -2^63 .. 2^63-1)"},
    {"a = 0x8000000000000000\n",
     "1:5: integer \"0x8000000000000000\" does not fit in 64 bits (range -2^63 .. 2^63-1)"},
    {"a = 99999999999999999999999\n",
     "1:5: integer \"99999999999999999999999\" does not fit in 64 bits (range -2^63 .. 2^63-1)"},
    {"a = 01\n", "1:5: leading zeros are not allowed in a number (\"01\")"},
    {"a = 1__0\n", "1:5: invalid number \"1__0\""},
    {"a = 1_\n", "1:5: invalid number \"1_\""},
    {"a = 0x\n", "1:5: invalid number \"0x\""},
    {"a = 0b102\n", "1:5: invalid number \"0b102\""},
    {"a = +0x10\n", "1:5: a sign is not allowed on a hexadecimal, octal or binary integer "
                    "(\"+0x10\")"},
    {"a = 1.\n", "1:5: invalid number \"1.\""},
    {"a = 1e\n", "1:5: invalid number \"1e\""},
    {"a = 3.e+20\n", "1:5: invalid number \"3.e+20\""},
    {"a = 1.5.3\n", "1:5: invalid number \"1.5.3\""},
    {"a = .5\n", "1:5: expected a value (string, number, true/false, array or inline table), "
                 "found '.'"},
    {"a = 1e400\n", "1:5: float \"1e400\" is out of the range of a double"},
    {"a = hello\n", "1:5: expected a value (string, number, true/false, array or inline table), "
                    "found 'h' (strings must be quoted)"},
    {"a = nope\n", "1:5: expected a value, found \"nope\" (strings must be quoted)"},
    {"a = truex\n", "1:5: expected a value (string, number, true/false, array or inline table), "
                    "found 't' (strings must be quoted)"},
    {"a = 1979-05-27\n", "1:5: dates and times are not supported in graphtrain configs (write the "
                         "value as a string)"},
    {"a = 07:32:00\n", "1:5: dates and times are not supported in graphtrain configs (write the "
                       "value as a string)"},
    {"[[products]]\nname = \"Hammer\"\n",
     "1:1: arrays of tables ([[name]]) are not supported in graphtrain configs"},
    {"a = \"x\x01y\"\n",
     "1:7: control character U+0001 must be escaped (write \\u0001) in a string"},
    {"# a \x7f\n", "1:5: control character U+007F is not allowed in a comment"},
    {"a = \"\xff\"\n", "1:6: invalid UTF-8 (byte 0xFF); TOML files must be UTF-8"},
    {"a = \"\xc0\x80\"\n", "1:6: invalid UTF-8 (byte 0xC0); TOML files must be UTF-8"},
    {"a = \"\xed\xa0\x80\"\n", "1:6: invalid UTF-8 (byte 0xED); TOML files must be UTF-8"},
    {"a = 1\r b = 2\n", "1:6: carriage return (\\r) not followed by a newline"},
    {"a = [1 2]\n", "1:8: expected ',' or ']' after an array element, found '2'"},
    {"a = [1,\n", "1:5: unterminated array (no closing ']')"},
    {"a = [1,]]\n", "1:9: expected a newline after a key/value pair, found ']'"},
    {"[a] b\n", "1:5: expected a newline after a table header, found 'b'"},
    {"[a\n", "1:3: expected ']' to close the table header, found end of line"},
    {"[]\n", "1:2: expected a key (letters, digits, '_', '-' or a quoted string), found ']'"},
    {"\"\"\"k\"\"\" = 1\n", "1:1: a multi-line string cannot be used as a key"},
    {"\xca\x9e\xca\x9e = 1\n", "1:1: expected a key (letters, digits, '_', '-' or a quoted "
                               "string), found byte 0xCA"},
    {"'\xca\x9e\xca\x9e' = 1 x\n", "1:10: expected a newline after a key/value pair, found 'x'"},
    {"a = 1\nb = 2\n  c = = 3\n", "3:7: expected a value (string, number, true/false, array or "
                                  "inline table), found '='"},
};

static void test_errors(void)
{
    for (size_t i = 0; i < sizeof error_cases / sizeof error_cases[0]; i++) {
        const error_case *c = &error_cases[i];
        gt_toml_value *r = NULL;
        gt_error err = {0};
        gt_status st = gt_toml_parse(c->input, strlen(c->input), "t.toml", &r, &err);
        char want[600];
        snprintf(want, sizeof want, "t.toml:%s", c->message);
        EXPECT(st == GT_ERR_INVALID && r == NULL && !strcmp(err.msg, want),
               "case %zu\n  input: %s\n  want:  %s\n  got:   %s", i, c->input, want, err.msg);
        gt_toml_free(r);
    }
    /* Nesting is capped (no stack exhaustion on hostile input). */
    char deep[300];
    memcpy(deep, "a = ", 4);
    memset(deep + 4, '[', 200);
    deep[204] = '\0';
    gt_toml_value *r = NULL;
    gt_error err = {0};
    EXPECT(gt_toml_parse(deep, strlen(deep), "t.toml", &r, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "nest deeper than 64 levels"),
           "deep nesting: %s", err.msg);
    gt_toml_free(r);
    /* A missing file is an I/O error naming it. */
    gt_error_clear(&err);
    EXPECT(gt_toml_parse_file("/nonexistent/x.toml", &r, &err) == GT_ERR_IO &&
               strstr(err.msg, "/nonexistent/x.toml: cannot open"),
           "missing file: %s", err.msg);
}

static void test_single_values(void)
{
    static const struct {
        const char *text;
        gt_toml_type type;
        double number;
    } ok[] = {
        {" 42 ", GT_TOML_INTEGER, 42},      {"0x10", GT_TOML_INTEGER, 16},
        {"-1_000", GT_TOML_INTEGER, -1000}, {"8e-4", GT_TOML_FLOAT, 8e-4},
        {"inf", GT_TOML_FLOAT, INFINITY},   {"true", GT_TOML_BOOLEAN, 1},
        {"[\"a\", 'b']", GT_TOML_ARRAY, 2}, {"\"s\"", GT_TOML_STRING, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        gt_toml_value *v = NULL;
        gt_error err = {0};
        gt_status st = gt_toml_parse_value(ok[i].text, strlen(ok[i].text), "value", &v, &err);
        bool good = st == GT_OK && v->type == ok[i].type;
        if (good && v->type == GT_TOML_INTEGER) good = (double)v->as.integer == ok[i].number;
        if (good && v->type == GT_TOML_FLOAT) good = v->as.number == ok[i].number;
        if (good && v->type == GT_TOML_ARRAY) good = v->as.array.n == (int)ok[i].number;
        EXPECT(good, "value [%s]: %s", ok[i].text, err.msg);
        gt_toml_free(v);
    }
    gt_toml_value *v = NULL;
    gt_error err = {0};
    EXPECT(gt_toml_parse_value("1 2", 3, "value", &v, &err) == GT_ERR_INVALID &&
               !strcmp(err.msg, "value: unexpected '2' after the value"),
           "trailing junk: %s", err.msg);
}

/* The shortest float text must read back to the same bits, through the TOML grammar. */
static void test_float_format(void)
{
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int good = 0, total = 0;
    double specials[] = {0.0,
                         -0.0,
                         1.0,
                         0.1,
                         8e-4,
                         1e-8,
                         5e-324,
                         2.2250738585072014e-308,
                         1.7976931348623157e308,
                         123456789012345678.0,
                         1e21,
                         1e-7};
    for (int i = 0; i < 3000 + 12; i++) {
        double d;
        if (i < 12) {
            d = specials[i];
        } else {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17; /* xorshift64 */
            memcpy(&d, &s, 8);
            if (isnan(d) || isinf(d)) continue;
        }
        char buf[48];
        gt_toml_format_float(d, buf, sizeof buf);
        gt_toml_value *v = NULL;
        gt_error err = {0};
        total++;
        if (gt_toml_parse_value(buf, strlen(buf), "value", &v, &err) == GT_OK &&
            v->type == GT_TOML_FLOAT && !memcmp(&v->as.number, &d, 8))
            good++;
        else
            fprintf(stderr, "float %.17g printed as %s does not read back: %s\n", d, buf, err.msg);
        gt_toml_free(v);
    }
    EXPECT(good == total, "%d of %d floats round-trip", good, total);
    char buf[48];
    gt_toml_format_float(1.0, buf, sizeof buf);
    EXPECT(!strcmp(buf, "1.0"), "1.0 printed as %s", buf);
    gt_toml_format_float(-INFINITY, buf, sizeof buf);
    EXPECT(!strcmp(buf, "-inf"), "-inf printed as %s", buf);
}

/* Every prefix and many single-byte mutations of a valid document: parse or fail cleanly (run
 * under ASan/UBSan this checks bounds), and every failure names the file with a position. */
static void test_robustness(void)
{
    const char *doc = "# config\n[training]\nsteps = 1_000\nlr = 8e-4\nname = \"a\\u00e9\\\"b\"\n"
                      "lit = '''x\ny'''\nm = \"\"\"\\\n  q\"\"\"\narr = [1, [2, 3], {a = 1}, ]\n"
                      "t = { x.y = 1, z = 'w' }\n[a.\"b c\".d]\nk = -inf\n";
    size_t n = strlen(doc);
    int bad_msgs = 0;
    gt_toml_value *r = NULL;
    gt_error err = {0};
    EXPECT(gt_toml_parse(doc, n, "r.toml", &r, &err) == GT_OK, "robustness base: %s", err.msg);
    gt_toml_free(r);
    for (size_t len = 0; len <= n; len++) {
        char *copy = malloc(len ? len : 1); /* exact size: ASan catches any read past the end */
        memcpy(copy, doc, len);
        gt_error_clear(&err);
        r = NULL;
        if (gt_toml_parse(copy, len, "r.toml", &r, &err) != GT_OK && strncmp(err.msg, "r.toml:", 7))
            bad_msgs++;
        gt_toml_free(r);
        free(copy);
    }
    static const char bytes[] = "[]{}\"'\\=.,#\n\r \t0xe_+-a\x80\xff";
    uint64_t s = 12345;
    for (int i = 0; i < 4000; i++) {
        char *copy = malloc(n);
        memcpy(copy, doc, n);
        for (int k = 0; k < 1 + i % 3; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            copy[(s >> 33) % n] = bytes[(s >> 17) % (sizeof bytes - 1)];
        }
        gt_error_clear(&err);
        r = NULL;
        if (gt_toml_parse(copy, n, "r.toml", &r, &err) != GT_OK && strncmp(err.msg, "r.toml:", 7))
            bad_msgs++;
        gt_toml_free(r);
        free(copy);
    }
    EXPECT(bad_msgs == 0, "%d failures without the file name", bad_msgs);
}

int main(void)
{
    test_comments_keys();
    test_strings();
    test_numbers_booleans();
    test_arrays_tables();
    test_errors();
    test_single_values();
    test_float_format();
    test_robustness();
    return gt_test_finish();
}
