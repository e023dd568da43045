package idemserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// canonicalJSON returns the JSON document body without the members at
// paths, with object members sorted and no insignificant space; numbers
// keep their text. It is the fingerprint's input under
// WithFingerprintIgnoring.
func canonicalJSON(body []byte, paths [][]string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("idemserver: fingerprint: the body is not JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("idemserver: fingerprint: the body holds more than one JSON value")
	}
	for _, p := range paths {
		drop(doc, p)
	}
	return json.Marshal(doc)
}

// drop deletes the member at path from the objects of doc.
func drop(doc any, path []string) {
	obj, ok := doc.(map[string]any)
	if !ok || len(path) == 0 {
		return
	}
	if len(path) == 1 {
		delete(obj, path[0])
		return
	}
	drop(obj[path[0]], path[1:])
}
