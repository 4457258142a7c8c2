// Package redact is auditd's one rule for what is a credential in a request:
// which query parameter and header names carry one, and how a URL, a path
// or a line of text is written without them. The fetch loop applies it at
// the edge, when an item is submitted and before any record of a request;
// the run store, the ledger, logs, API responses and exports only ever see
// its output. Reports apply it again to what they export, as a second
// guard.
//
// A name is a credential's when a source declares it (secret_query) or
// when it looks like one: compared case-insensitively, percent-decoded,
// with everything but letters and digits removed ("api_key", "API-Key" and
// "api%5Fkey" are all "apikey"), it contains token, secret, password,
// signature, credential, authorization, session, cookie, apikey,
// accesskey, privatekey, keypair, hmac or jwt, ends in "key", or is one of
// auth, sig, pwd, pass, code, sid, otp. "keyword" and "author" survive.
//
// What is redacted: the value of every query parameter with such a name
// (the name stays, the value becomes Replacement), and the userinfo of an
// absolute or scheme-relative URL (user:password@, which becomes
// Replacement@). A query runs from the first '?' to the end; its pairs are
// separated by '&', ';' and '#'. A credential's value runs to the next '&'
// or '#', so that an upstream that takes ';' for part of a value gets
// nothing of it either.
package redact
