module keelson.local/go-runner

go 1.24
