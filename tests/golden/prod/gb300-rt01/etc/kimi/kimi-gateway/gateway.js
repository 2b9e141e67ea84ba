// The kimi-gateway's njs functions (nginx's JavaScript module); rendered by kimi-deploy.
var crypto = require("crypto");
var SERVED = "kimi-local";
var HOSTED = null;
var HAS_FALLBACK = false;
var MAX_TOKENS = null;

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

// The hosted API is paid by the request and by the token, with a key clients never see: it gets
// one chat or completion of the served model, bounded, or nothing. Fields that multiply what it
// generates are held to these bounds (n and best_of: answers per request; max_tokens and
// max_completion_tokens: tokens per answer, and a request naming neither is given max_tokens).
var CAPS = {n: 1, best_of: 1, max_tokens: MAX_TOKENS, max_completion_tokens: MAX_TOKENS};
// Deeper JSON than this is refused rather than walked (tool schemas nest a few dozen levels).
var MAX_DEPTH = 1000;
var NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/g;

// The body for the hosted API, or "" where fallback_refusal refuses the request: the served
// model's request with "model" the hosted model's name and the bounds above in place; every other
// byte stays as the client sent it (a JSON.stringify of the parsed body would round numbers past
// 2^53, such as a seed).
function fallback_body(r) {
    var plan = hosted_request(r.requestText || "");
    return plan.error === undefined ? plan.body : "";
}

// "" when the request may go to the hosted API, else the OpenAI-style error the client gets (400).
function fallback_refusal(r) {
    var plan = hosted_request(r.requestText || "");
    if (plan.error === undefined) {
        return "";
    }
    return JSON.stringify({error: {message: "the hosted fallback: " + plan.error, type: "invalid_request_error"}});
}

// {body} to send, or {error}: one JSON object naming each top-level member once (as any JSON
// parser reads it: "\u006dodel" is "model"), whose "model" is the served name.
function hosted_request(text) {
    var members;
    try {
        members = top_level_members(text);
    } catch (e) {
        return {error: "the body must be one JSON object (" + e.message + ")"};
    }
    var seen = {};
    for (var m = 0; m < members.length; m++) {
        var name = "k" + members[m][0];
        if (seen[name] !== undefined) {
            return {error: "the body names " + JSON.stringify(members[m][0]) + " more than once"};
        }
        seen[name] = members[m];
    }
    var model = seen.kmodel;
    if (model === undefined || value_of(text, model) !== SERVED) {
        return {error: "\"model\" must be " + JSON.stringify(SERVED) + ", the model this gateway serves"};
    }
    var prompt = seen.kprompt;
    if (prompt !== undefined && !one_prompt(value_of(text, prompt))) {
        return {error: "\"prompt\" must be one prompt: a string or a list of token ids"};
    }
    // Replacements, back to front so that earlier spans keep their places.
    var edits = [[model[1], model[2], JSON.stringify(HOSTED)]];
    for (var field in CAPS) {
        var member = seen["k" + field];
        if (member !== undefined) {
            var v = value_of(text, member);
            if (typeof v !== "number" || !(v <= CAPS[field])) {
                edits.push([member[1], member[2], String(CAPS[field])]);
            }
        }
    }
    if (seen.kmax_tokens === undefined && seen.kmax_completion_tokens === undefined) {
        var open = text.indexOf("{") + 1;
        edits.push([open, open, "\"max_tokens\": " + MAX_TOKENS + ", "]);
    }
    edits.sort(function (a, b) { return b[0] - a[0]; });
    var out = text;
    for (var e = 0; e < edits.length; e++) {
        out = out.slice(0, edits[e][0]) + edits[e][2] + out.slice(edits[e][1]);
    }
    return {body: out};
}

// A member's value, parsed; undefined where njs cannot parse it (nested past its 32 levels).
function value_of(text, member) {
    try {
        return JSON.parse(text.slice(member[1], member[2]));
    } catch (e) {
        return undefined;
    }
}

// A completion's prompt that asks for one completion: a string or a list of token ids, alone or
// as a list's only item (a list of several strings or lists is a batch, one completion each).
function one_prompt(v) {
    if (typeof v === "string" || token_ids(v)) {
        return true;
    }
    return Array.isArray(v) && v.length === 1 && (typeof v[0] === "string" || token_ids(v[0]));
}

function token_ids(v) {
    if (!Array.isArray(v)) {
        return false;
    }
    for (var i = 0; i < v.length; i++) {
        if (typeof v[i] !== "number") {
            return false;
        }
    }
    return true;
}

// The top-level members of the JSON object ``text`` is, in order: [name, start, end) with the
// member's decoded name and where its value's text lies. Throws unless ``text`` is exactly one
// JSON object (RFC 8259's grammar; a string's characters are not checked beyond its escapes, which
// decide where it ends): then every JSON parser reads the same members from it. One pass with a
// stack of open brackets, no recursion and no parse of the whole body (njs's JSON.parse stops at
// 32 levels); only top-level names are decoded, with JSON.parse.
function top_level_members(text) {
    var members = [];
    var closers = [];
    var i = skip(text, 0);
    if (text[i] !== "{") {
        throw new Error("it does not start with '{'");
    }
    closers.push("}");
    i++;
    var want = "first_key"; // then "colon", "value", "next", "key"; in a list "first_value"
    var name = "";
    var start = 0;
    for (;;) {
        i = skip(text, i);
        var c = text[i];
        if (c === undefined) {
            throw new Error("it ends inside a value");
        }
        var top = closers[closers.length - 1];
        if (c === top && (want === "next" || want === "first_key" || want === "first_value")) {
            closers.pop();
            i++;
            if (closers.length === 0) {
                if (skip(text, i) !== text.length) {
                    throw new Error("there is more after it");
                }
                return members;
            }
            if (closers.length === 1) {
                members.push([name, start, i]);
            }
            want = "next";
        } else if (want === "next") {
            if (c !== ",") {
                throw new Error("a value is followed by " + JSON.stringify(c) + ", not ',' or '" + top + "'");
            }
            i++;
            want = top === "}" ? "key" : "value";
        } else if (want === "key" || want === "first_key") {
            if (c !== '"') {
                throw new Error("a name is not a string");
            }
            var end = string_end(text, i);
            if (closers.length === 1) {
                name = JSON.parse(text.slice(i, end));
            }
            i = end;
            want = "colon";
        } else if (want === "colon") {
            if (c !== ":") {
                throw new Error("a name is not followed by ':'");
            }
            i++;
            want = "value";
        } else {
            if (closers.length === 1) {
                start = i;
            }
            if (c === "{" || c === "[") {
                if (closers.length >= MAX_DEPTH) {
                    throw new Error("it nests deeper than " + MAX_DEPTH + " levels");
                }
                closers.push(c === "{" ? "}" : "]");
                want = c === "{" ? "first_key" : "first_value";
                i++;
                continue;
            }
            i = c === '"' ? string_end(text, i) : scalar_end(text, i);
            if (closers.length === 1) {
                members.push([name, start, i]);
            }
            want = "next";
        }
    }
}

// The index of the first character at or after ``i`` that is not JSON whitespace.
function skip(text, i) {
    while (i < text.length && " \t\r\n".indexOf(text[i]) >= 0) {
        i++;
    }
    return i;
}

// The index just past the string token that starts at ``start`` (its opening quote).
function string_end(text, start) {
    var i = start + 1;
    while (text[i] !== '"') {
        if (i >= text.length) {
            throw new Error("a string does not end");
        }
        i += text[i] === "\\" ? 2 : 1;
    }
    return i + 1;
}

// The index just past the number or literal (true, false, null) that starts at ``i``.
function scalar_end(text, i) {
    var literals = ["true", "false", "null"];
    for (var n = 0; n < literals.length; n++) {
        if (text.startsWith(literals[n], i)) {
            return i + literals[n].length;
        }
    }
    NUMBER.lastIndex = i;
    var m = NUMBER.exec(text);
    if (m === null || m.index !== i) {
        throw new Error("a value is not JSON");
    }
    return i + m[0].length;
}

// GET /health: {"backend": the backend's (router's or engine's) /health answers 200, "fallback": one is configured}.
async function health(r) {
    var reply = await r.subrequest("/.backend-health");
    var up = reply.status === 200;
    r.headersOut["Content-Type"] = "application/json";
    r.return(up || HAS_FALLBACK ? 200 : 503, JSON.stringify({backend: up, fallback: HAS_FALLBACK}));
}

export default {client_ok, fallback_body, fallback_refusal, health};
