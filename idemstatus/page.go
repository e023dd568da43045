package idemstatus

import (
	"html/template"
	"net/url"
	"strconv"
	"time"
)

// pageData is what the HTML page is made from: the Status and the page's
// size.
type pageData struct {
	Status
	Limit, MaxWalk int
}

// pageURL returns the query of a page link: the cursor and the limit.
func pageURL(after string, limit int) template.URL {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit != DefaultLimit {
		q.Set("limit", strconv.Itoa(limit))
	}
	return template.URL("?" + q.Encode())
}

var page = template.Must(template.New("idem").Funcs(template.FuncMap{
	"age": func(seconds float64) string {
		return (time.Duration(seconds * float64(time.Second))).Round(time.Second).String()
	},
	"total":     Total,
	"thousands": thousands,
	"n64":       func(n int64) string { return thousands(int(n)) },
	"ts":        func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"page":      pageURL,
	"firstRequests": func(c *Counts) int64 {
		return Total(c.Attempts) - Total(c.Retries) - c.Resent
	},
}).Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>idem</title>
<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;font-size:90%;vertical-align:top}th{background:#eee}.bad{color:#a00}.do{color:#045}nav a{margin-right:1em}</style>
</head><body>
<h1>idem</h1>
<p>As of {{ts .Time}}. <a href="?format=json">JSON</a></p>
{{with .Error}}<p class="bad">Journal: {{.}}</p>{{end}}
{{with .Pending}}{{$p := .}}
<h2>Pending: {{thousands .Count}}{{if .Truncated}}+{{end}}</h2>
<p>{{thousands .InFlight}} in flight, {{thousands .InDoubt}} in doubt{{if .Unreadable}}, <span class="bad">{{thousands .Unreadable}} unreadable</span>{{end}}.{{if .OldestInDoubt}} Oldest in doubt: {{age .OldestInDoubtAge}} old (created {{ts .OldestInDoubt}}).{{end}}{{if .Truncated}} Counted up to the first {{thousands $.MaxWalk}}.{{end}}</p>
{{if .Operations}}<p id="shown">Showing {{thousands .From}}–{{thousands .To}} of {{thousands .Count}}{{if .Truncated}}+{{end}} pending operations, in key order.</p>
<nav>{{if .After}}<a href="{{page "" $.Limit}}">first page</a>{{end}}{{if .Next}}<a id="next" href="{{page .Next $.Limit}}">next {{$.Limit}}</a>{{end}}</nav>
<table id="pending">
<tr><th>key</th><th>name</th><th>request</th><th>age</th><th>attempts</th><th>last status</th><th>why pending</th><th>what to do</th></tr>
{{range .Operations}}<tr><td>{{.Key}}</td><td>{{.Name}}</td><td>{{.Method}} {{.URL}}</td><td>{{age .AgeSeconds}}</td><td>{{.Attempts}}</td><td>{{if .LastStatus}}{{.LastStatus}}{{else if .LastError}}no answer{{else}}–{{end}}</td><td>{{if .Unreadable}}<span class="bad">{{.Why}}</span>{{else}}{{.Why}}{{end}}{{if .NeedsCredentials}} <b>Needs credentials.</b>{{end}}</td><td class="do">{{.Do}}</td></tr>
{{end}}</table>
<nav>{{if .After}}<a href="{{page "" $.Limit}}">first page</a>{{end}}{{if .Next}}<a href="{{page .Next $.Limit}}">next {{$.Limit}}</a>{{end}}</nav>
{{else if .After}}<p>No pending operations after {{.After}}. <a href="{{page "" $.Limit}}">First page</a></p>{{end}}
{{end}}
{{with .Counts}}
<h2>Counters</h2>
<table id="counters">
<tr><th>requests written</th><td>{{n64 (total .Attempts)}} = {{n64 (firstRequests .)}} first requests (and Resume's) + {{n64 (total .Retries)}} retries + {{n64 .Resent}} resent by net/http on a dead connection</td></tr>
<tr><th>settled</th><td>{{n64 (total .Settled)}}{{range $state, $n := .Settled}} ({{$state}}: {{n64 $n}}){{end}}</td></tr>
<tr><th>left in doubt</th><td>{{n64 .InDoubt}}</td></tr>
<tr><th>resumed</th><td>{{n64 .Resumed}}</td></tr>
<tr><th>expired</th><td>{{n64 .Expired}}</td></tr>
{{if .JournalErrors}}<tr><th class="bad">journal write failures</th><td class="bad">{{range $w, $n := .JournalErrors}}{{$w}}: {{n64 $n}} {{end}}</td></tr>{{end}}
</table>
<table id="reasons"><tr><th>attempt outcome</th><th>requests</th><th>retried</th></tr>
{{$r := .Retries}}{{range $reason, $n := .Attempts}}<tr><td>{{$reason}}</td><td>{{n64 $n}}</td><td>{{n64 (index $r $reason)}}</td></tr>
{{end}}</table>
{{end}}
{{if .Recent}}
<h2>Recent</h2>
<table id="recent"><tr><th>time</th><th>event</th><th>key</th><th>name</th><th>request</th><th>state</th><th>attempts</th><th>last status / error</th></tr>
{{range .Recent}}<tr><td>{{ts .Time}}</td><td>{{.Kind}}</td><td>{{.Key}}</td><td>{{.Name}}</td><td>{{.Method}} {{.URL}}</td><td>{{.State}}</td><td>{{.Attempts}}</td><td>{{if .Status}}{{.Status}} {{end}}{{.Err}}</td></tr>
{{end}}</table>
{{end}}
</body></html>
`))
