-- cdc-sync demo: the SQL Server side, run once by the mssql-init service of
-- docker-compose.yml as sa with: sqlcmd -b -v CDC_PASSWORD=... -i mssql-init.sql
-- Idempotent: running it again changes nothing.

IF DB_ID(N'CdcDemo') IS NULL
    CREATE DATABASE CdcDemo;
GO

-- SNAPSHOT transactions: every poll runs in one (off by default).
ALTER DATABASE CdcDemo SET ALLOW_SNAPSHOT_ISOLATION ON;
GO

-- Database-level change tracking. Retention must exceed the longest time the sidecar may be down.
IF NOT EXISTS (SELECT 1 FROM sys.change_tracking_databases WHERE database_id = DB_ID(N'CdcDemo'))
    ALTER DATABASE CdcDemo SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 2 DAYS, AUTO_CLEANUP = ON);
GO

USE CdcDemo;
GO

-- A tracked table: change tracking needs a primary key (error 4997 without one).
IF OBJECT_ID(N'dbo.Forecasts', N'U') IS NULL
BEGIN
    CREATE TABLE dbo.Forecasts (
        Id int NOT NULL CONSTRAINT PK_Forecasts PRIMARY KEY,
        RegionId int NOT NULL,
        Price decimal(12, 2) NOT NULL,
        ValidFrom datetime2(3) NOT NULL,
        ValidTo datetime2(3) NULL,
        Status nvarchar(20) NOT NULL CONSTRAINT DF_Forecasts_Status DEFAULT N'draft'
    );
    INSERT INTO dbo.Forecasts (Id, RegionId, Price, ValidFrom, ValidTo, Status)
    VALUES (1, 10, 12.50, '2026-01-01T00:00:00', NULL, N'live'),
           (2, 10, 13.75, '2026-01-01T00:00:00', '2026-12-31T23:59:59', N'live'),
           (3, 20, 9.99, '2026-02-01T00:00:00', NULL, N'draft');
END
GO

IF NOT EXISTS (SELECT 1 FROM sys.change_tracking_tables WHERE object_id = OBJECT_ID(N'dbo.Forecasts'))
    ALTER TABLE dbo.Forecasts ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON);
GO

-- The sidecar's login: SELECT and VIEW CHANGE TRACKING on the tracked tables, nothing more.
IF SUSER_ID(N'cdc_sidecar') IS NULL
    CREATE LOGIN cdc_sidecar WITH PASSWORD = N'$(CDC_PASSWORD)', CHECK_POLICY = OFF, DEFAULT_DATABASE = CdcDemo;
GO

IF USER_ID(N'cdc_sidecar') IS NULL
    CREATE USER cdc_sidecar FOR LOGIN cdc_sidecar;
GO

GRANT SELECT ON dbo.Forecasts TO cdc_sidecar;
GRANT VIEW CHANGE TRACKING ON dbo.Forecasts TO cdc_sidecar;
GO
