package stream

// WarmBytes is how far apart this machine's writers reuse a slot (Note
// [how far apart a writer reuses a slot]).
var WarmBytes = warmBytes
