module github.com/idemgo/idem/cmd/idem

go 1.25.0

require (
	github.com/google/uuid v1.6.0
	github.com/idemgo/idem v0.0.0
	github.com/idemgo/idem/pgstore v0.0.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/stretchr/testify v1.12.1
	go.etcd.io/bbolt v1.5.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// The replace directives make this module build from the repository's
// own idem and pgstore (with go.work or without). `go install
// github.com/idemgo/idem/cmd/idem@VERSION` refuses a module whose go.mod
// has replace directives, so a release tag of this module (cmd/idem/vX.Y.Z)
// is made on a go.mod without them, requiring the tagged idem and pgstore
// versions, as gopls does for golang.org/x/tools.
replace (
	github.com/idemgo/idem => ../..
	github.com/idemgo/idem/pgstore => ../../pgstore
)
