// The kimi-gateway's njs functions (nginx's JavaScript module); rendered by kimi-deploy.
var crypto = require("crypto");
var SERVED = "kimi-local";
var HOSTED = null;
var HAS_FALLBACK = false;

// "1" when the request's Authorization header is the client key's ("Bearer <key>"), else "0":
// digests are compared, so how long the comparison takes says nothing about the key.
function client_ok(r) {
    var header = r.headersIn.Authorization;
    if (!header) {
        return "0";
    }
    var digest = crypto.createHash("sha256").update(header).digest("hex");
    return digest === r.variables.kimi_client_sha256 ? "1" : "0";
}

// The body for the hosted API: in a JSON object, each top-level "model" whose value is the served
// name gets the hosted model's name; every other byte stays as the client sent it (a JSON.stringify
// of the parsed body would round numbers past 2^53, such as a seed). Any other body goes as it came.
function fallback_body(r) {
    var text = r.requestText;
    if (!text) {
        return "";
    }
    var spans;
    try {
        spans = top_level_models(text);
    } catch (e) {
        return text; // not JSON: the hosted API answers it
    }
    var out = text;
    for (var n = spans.length - 1; n >= 0; n--) {
        out = out.slice(0, spans[n][0]) + JSON.stringify(HOSTED) + out.slice(spans[n][1]);
    }
    return out;
}

// Where each top-level "model" member's string value equal to the served name lies in ``text``:
// [start, end) of its quoted token; none unless ``text`` starts as a JSON object. One pass with a
// depth count, no recursion and no parse of the whole body (njs's JSON.parse stops at 32 levels,
// and tool schemas nest); only the member's own name and value are decoded, with JSON.parse.
function top_level_models(text) {
    var spans = [];
    if (text.trimStart()[0] !== "{") {
        return spans;
    }
    var depth = 0;
    var want_key = false;
    var i = 0;
    while (i < text.length) {
        var c = text[i];
        if (c === '"') {
            var end = string_end(text, i);
            if (depth === 1 && want_key) {
                want_key = false;
                var key = JSON.parse(text.slice(i, end));
                var colon = text.indexOf(":", end);
                if (colon < 0) {
                    return spans;
                }
                var v = colon + 1;
                while (" \t\r\n".indexOf(text[v]) >= 0) {
                    v++;
                }
                if (key === "model" && text[v] === '"') {
                    var value_end = string_end(text, v);
                    if (JSON.parse(text.slice(v, value_end)) === SERVED) {
                        spans.push([v, value_end]);
                    }
                    i = value_end;
                    continue;
                }
                i = v;
                continue;
            }
            i = end;
            continue;
        }
        if (c === "{" || c === "[") {
            depth++;
            want_key = depth === 1;
        } else if (c === "}" || c === "]") {
            depth--;
        } else if (c === "," && depth === 1) {
            want_key = true;
        }
        i++;
    }
    return spans;
}

// The index just past the string token that starts at ``start`` (its opening quote).
function string_end(text, start) {
    var i = start + 1;
    while (text[i] !== '"') {
        if (i >= text.length) {
            throw new Error("unterminated string");
        }
        i += text[i] === "\\" ? 2 : 1;
    }
    return i + 1;
}

// GET /health: {"backend": the router's /health answers 200, "fallback": one is configured}.
async function health(r) {
    var reply = await r.subrequest("/.backend-health");
    var up = reply.status === 200;
    r.headersOut["Content-Type"] = "application/json";
    r.return(up || HAS_FALLBACK ? 200 : 503, JSON.stringify({backend: up, fallback: HAS_FALLBACK}));
}

export default {client_ok, fallback_body, health};
