module github.com/weirproxy/weir/sdk

go 1.26
